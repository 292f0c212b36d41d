// The trace of an expert layer: per pass, what the kernel family reported it ran.
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "gmm/core/error.hpp"
#include "gmm/core/options.hpp"
#include "gmm/plan.hpp"

namespace gmm {

// One pass of gmm::forward / gmm::backward: the CallTrace filled by the kernel that ran (family,
// ISA path, tiles, threads, each operand's quantization, extra bytes) and what the layer did
// around the call.
struct PassTrace {
  Pass pass = Pass::fwd;
  Family planned = Family::v2;   // what the plan chose; call.family is what actually ran
  CallTrace call;                // filled by the kernel family
  std::string folded;            // a scale folded into an operand before the call, "" if none
  std::int64_t layer_bytes = 0;  // buffers the layer allocated for the pass (quantized weights,
                                 // folded gradient), beyond call.extra_bytes
};

// The passes of one layer that ran last, indexed by Pass. forward sets fwd; backward sets dlhs
// and drhs (and clears a pass it skipped), so one Trace shows a whole training step.
struct Trace {
  std::array<std::optional<PassTrace>, 3> passes;

  bool ran(Pass pass) const { return passes[static_cast<int>(pass)].has_value(); }

  const PassTrace& at(Pass pass) const {
    detail::require(ran(pass), "gmm::Trace::at", "pass", "a pass that ran", name(pass));
    return *passes[static_cast<int>(pass)];
  }
};

}  // namespace gmm

// "float8_e4m3fn 1x1x512 in kernel", "f32": an operand as it entered the kernel.
template <>
struct fmt::formatter<gmm::OperandTrace> : fmt::formatter<std::string_view> {
  auto format(const gmm::OperandTrace& o, format_context& ctx) const {
    std::string text(gmm::name(o.dtype));
    if (o.quantized) {
      text += fmt::format(" scales {}x{}x{}", o.block.groups, o.block.rows, o.block.cols);
      if (!o.quantized_by.empty()) text += fmt::format(" ({})", o.quantized_by);
    }
    return fmt::formatter<std::string_view>::format(text, ctx);
  }
};

// "dlhs: v1 avx512bf16 gmm tiles 128x128x128 threads 2 | lhs ... | rhs ... | extra 64 KiB".
template <>
struct fmt::formatter<gmm::PassTrace> : fmt::formatter<std::string_view> {
  auto format(const gmm::PassTrace& t, format_context& ctx) const {
    const std::int64_t extra = t.call.extra_bytes + t.layer_bytes;
    std::string text = fmt::format(
        "{}: {} {} {} tiles {}x{}x{} threads {} | lhs {} | rhs {} | extra {} KiB", t.pass,
        gmm::name(t.call.family), gmm::name(t.call.isa), t.call.op, t.call.tiles.m, t.call.tiles.k,
        t.call.tiles.n, t.call.threads, t.call.lhs, t.call.rhs, (extra + 1023) / 1024);
    if (!t.folded.empty()) text += fmt::format(" | folded {}", t.folded);
    return fmt::formatter<std::string_view>::format(text, ctx);
  }
};
