// Plans: which kernel family (v1 or v2) runs each pass (fwd, dlhs, drhs) of an expert layer.
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gmm/core/dtype.hpp"
#include "gmm/core/error.hpp"
#include "gmm/core/options.hpp"
#include "gmm/v1/isa.hpp"

namespace gmm {

// The three passes of an expert layer y = gmm(x, w): the forward product, the gradient of the
// activations (dlhs: dx = gmm(dy, w, transpose_rhs)) and of the weights (drhs: dw = tgmm(x, dy)).
enum class Pass : std::uint8_t { fwd, dlhs, drhs };

inline constexpr std::array<Pass, 3> all_passes = {Pass::fwd, Pass::dlhs, Pass::drhs};

constexpr std::string_view name(Pass p) {
  return p == Pass::fwd ? "fwd" : p == Pass::dlhs ? "dlhs" : "drhs";
}

// What a pass multiplies, as the kernels see it; the families' relative speed depends on it. v1
// always dequantizes tiles to fp32 and multiplies them with Eigen, while v2 runs its fp32 FMA
// kernel when an operand enters the product in fp32 and its bf16 kernels (AMX, AVX-512 BF16 dot
// product, or AVX-512F on widened values) when both operands are exact in bf16.
enum class Arithmetic : std::uint8_t {
  fp32,       // an operand enters the product as unquantized f32
  bf16,       // both operands are unquantized bf16
  quantized,  // no unquantized f32 operand, and at least one fp8 / int8 operand (quantized by
              // the caller or in the call)
};

inline constexpr std::array<Arithmetic, 3> all_arithmetics = {Arithmetic::fp32, Arithmetic::bf16,
                                                              Arithmetic::quantized};

constexpr std::string_view name(Arithmetic a) {
  return a == Arithmetic::fp32 ? "fp32" : a == Arithmetic::bf16 ? "bf16" : "quantized";
}

// The arithmetic of a gmm / tgmm call whose operands have these dtypes, each quantized by the
// call itself or not (Options::quantize_lhs / quantize_rhs).
constexpr Arithmetic arithmetic_of(DType lhs, bool quantize_lhs, DType rhs, bool quantize_rhs) {
  if ((lhs == DType::f32 && !quantize_lhs) || (rhs == DType::f32 && !quantize_rhs)) {
    return Arithmetic::fp32;
  }
  const bool quantized = quantize_lhs || quantize_rhs || is_quantized(lhs) || is_quantized(rhs);
  return quantized ? Arithmetic::quantized : Arithmetic::bf16;
}

// What the auto plan looks at to pick a family for one pass: how many rows each group
// multiplies its [K, N] weight with on average (the weight reuse), and the arithmetic.
struct PassShape {
  std::int64_t groups = 1;  // local groups that own at least one row
  std::int64_t rows = 0;    // rows the local groups own
  Arithmetic arithmetic = Arithmetic::fp32;

  // Rows per group owning rows (0 when no group does).
  double rows_per_group() const {
    return groups > 0 ? static_cast<double>(rows) / static_cast<double>(groups) : 0.0;
  }
};

// The auto plan's rule, with every threshold in this one place: v1 runs pass p on arithmetic a
// when the shape's rows per group is at most v1_max_rows_per_group[p][a] and v1 was compiled
// for at least v1_min_isa; v2 otherwise (a negative bound: never v1).
//
// The defaults come from gmm_bench (docs/performance.md, 2026-12-03, commit 8cdf1be, AMD EPYC
// Zen 4 with AVX-512 BF16, 2 threads; v1 compiled with -march=native, i.e. AVX-512; v1/v2 is the
// ratio of their GFLOP/s on the same shape and recipe): v1 never leads by more than 1%, within
// the run-to-run noise, so the rule never picks v1.
// - fp32 fwd and dlhs, medians of 3 runs: v1/v2 1.00 and 0.75 on dsv3-up (16 rows per group),
//   0.86 and 0.83 on dsv3-down, 0.86 and 0.74 on gptoss (64), 0.75 and 0.62 on qwen3-30b (64),
//   0.83 and 0.86 on decode (1), 1.01 and 0.66 on skewed (32 mean, Zipf); single runs: 0.87 and
//   0.78 on mixtral (256), 0.79 and 0.78 on compute-bound (1024). Before v2's streaming kernels
//   for few rows, its column splitting and its A-panel-in-L1 loop order (measured on another
//   machine, commit 7aeb4db), v1 led by 1.02 to 3.6 on the shapes with at most 64 rows per group
//   and the bound was 128: a machine of your own may call for it again (PassOptions::auto_rule).
// - fp32 drhs: v1/v2 0.55 to 0.95 on every shape.
// - bf16 and quantized (fp8 recipes): v1/v2 0.10 to 0.50 on every fwd and dlhs cell, 0.28 to 0.75
//   on every drhs cell (v1 multiplies dequantized fp32 tiles with Eigen).
// - v1_min_isa: a rule that picks v1 holds for v1 compiled with AVX-512 (gmm_bench is built with
//   -march=native); v2 picks its AVX-512 kernels at run time whatever the flags. Built without
//   -march (Eigen with SSE2), v1/v2 in fp32 was 0.51 to 0.59 on dsv3-up and skewed (commit
//   7554c87), so such a rule keeps to v2 there.
struct AutoThresholds {
  // [pass (fwd, dlhs, drhs)][arithmetic (fp32, bf16, quantized)]
  double v1_max_rows_per_group[3][3] = {{-1, -1, -1}, {-1, -1, -1}, {-1, -1, -1}};
  Isa v1_min_isa = Isa::avx512f;
};

inline constexpr AutoThresholds auto_thresholds{};

// The family the auto plan runs `pass` with on `shape` (a rule on the shape, not a timing run),
// given the ISA v1 was compiled for (Isa order: scalar < avx2 < avx512f).
inline Family auto_family(Pass pass, const PassShape& shape,
                          const AutoThresholds& thresholds = auto_thresholds,
                          Isa v1_isa = v1::compiled_isa()) {
  const double bound =
      thresholds.v1_max_rows_per_group[static_cast<int>(pass)][static_cast<int>(shape.arithmetic)];
  const bool v1_vectorized = static_cast<int>(v1_isa) >= static_cast<int>(thresholds.v1_min_isa);
  return v1_vectorized && shape.rows_per_group() <= bound ? Family::v1 : Family::v2;
}

// A per-pass choice of kernel family {fwd, dlhs, drhs}; an empty choice means "auto" (picked
// per shape by auto_family). All 8 fixed combinations are valid on a CPU: both families take
// every operand layout, group pattern and quantization of every pass, and compute the same
// values to fp32 summation error, so a plan only changes speed.
//
// Text form (parse and fmt): "v1" (v1,v1,v1), "v2" (v2,v2,v2, the one-word all-v2 switch),
// "hybrid" (v2,v1,v2: fused forward and weight gradient, Megablox-style dlhs), "auto", or three
// comma-separated choices among v1, v2 and auto in pass order, e.g. "v2,v2,v1". Printing gives
// the preset name when the plan is a preset and the triple otherwise, so
// Plan::parse(fmt::format("{}", plan)) == plan for every plan, and printing a parsed canonical
// string gives it back ("v2,v1,v2" parses to the hybrid plan and prints as "hybrid").
struct Plan {
  std::optional<Family> fwd = Family::v2;
  std::optional<Family> dlhs = Family::v1;
  std::optional<Family> drhs = Family::v2;

  static Plan v1() { return {Family::v1, Family::v1, Family::v1}; }
  static Plan v2() { return {Family::v2, Family::v2, Family::v2}; }
  static Plan hybrid() { return {Family::v2, Family::v1, Family::v2}; }
  static Plan automatic() { return {std::nullopt, std::nullopt, std::nullopt}; }
  // The one-word switch of MaxText's use_gmm_v2: all passes v2, or all v1.
  static Plan all_v2(bool use_v2) { return use_v2 ? v2() : v1(); }

  std::optional<Family> choice(Pass pass) const {
    return pass == Pass::fwd ? fwd : pass == Pass::dlhs ? dlhs : drhs;
  }

  // The family that runs `pass` on `shape`; `rule` decides an auto choice.
  Family family(Pass pass, const PassShape& shape,
                const AutoThresholds& rule = auto_thresholds) const {
    const std::optional<Family> chosen = choice(pass);
    return chosen ? *chosen : auto_family(pass, shape, rule);
  }

  static Plan parse(std::string_view text) {
    if (text == "v1") return v1();
    if (text == "v2") return v2();
    if (text == "hybrid") return hybrid();
    if (text == "auto") return automatic();
    Plan plan;
    std::string_view rest = text;
    for (Pass pass : all_passes) {
      const std::size_t comma = rest.find(',');
      const bool last = pass == Pass::drhs;
      if (last != (comma == std::string_view::npos)) fail_parse(text);
      const std::string_view word = rest.substr(0, comma);
      std::optional<Family> chosen;
      if (word == "v1") {
        chosen = Family::v1;
      } else if (word == "v2") {
        chosen = Family::v2;
      } else if (word != "auto") {
        fail_parse(text);
      }
      (pass == Pass::fwd ? plan.fwd : pass == Pass::dlhs ? plan.dlhs : plan.drhs) = chosen;
      rest = last ? std::string_view() : rest.substr(comma + 1);
    }
    return plan;
  }

  std::string to_string() const {
    if (*this == v1()) return "v1";
    if (*this == v2()) return "v2";
    if (*this == hybrid()) return "hybrid";
    if (*this == automatic()) return "auto";
    auto word = [](std::optional<Family> f) { return f ? name(*f) : std::string_view("auto"); };
    return fmt::format("{},{},{}", word(fwd), word(dlhs), word(drhs));
  }

  friend bool operator==(const Plan& a, const Plan& b) {
    return a.fwd == b.fwd && a.dlhs == b.dlhs && a.drhs == b.drhs;
  }
  friend bool operator!=(const Plan& a, const Plan& b) { return !(a == b); }

 private:
  [[noreturn]] static void fail_parse(std::string_view text) {
    detail::fail("gmm::Plan::parse", "plan",
                 "\"v1\", \"v2\", \"hybrid\", \"auto\" or three of v1/v2/auto separated by "
                 "commas (fwd,dlhs,drhs), e.g. \"v2,v1,v2\"",
                 fmt::format("\"{}\"", text));
  }
};

}  // namespace gmm

template <>
struct fmt::formatter<gmm::Plan> : fmt::formatter<std::string_view> {
  auto format(const gmm::Plan& plan, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(plan.to_string(), ctx);
  }
};
template <>
struct fmt::formatter<gmm::Pass> : fmt::formatter<std::string_view> {
  auto format(gmm::Pass pass, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(gmm::name(pass), ctx);
  }
};
