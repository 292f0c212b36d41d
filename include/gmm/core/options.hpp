// Options of one gmm / tgmm call, and the trace a call fills to say what actually ran.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "gmm/core/calibration.hpp"
#include "gmm/core/dtype.hpp"
#include "gmm/core/view.hpp"

namespace gmm {

// The two kernel families: v1 quantizes outside the kernel (Megablox), v2 fuses it (Tokamax v2).
enum class Family : std::uint8_t { v1, v2 };

// Micro-kernel instruction set. `automatic` takes the widest the CPU has, or the GMM_ISA
// environment variable (scalar, avx2, avx512f, avx512bf16, amx) when set; where a narrower path
// is faster for the data it runs that one (kernels::call_kit: CallTrace::isa says which ran).
// amx is Intel AMX (tile registers, bf16 tile dot products).
enum class Isa : std::uint8_t { automatic, scalar, avx2, avx512f, avx512bf16, amx };

constexpr std::string_view name(Family f) { return f == Family::v1 ? "v1" : "v2"; }
constexpr std::string_view name(Isa i) {
  switch (i) {
    case Isa::automatic:
      return "automatic";
    case Isa::scalar:
      return "scalar";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512f:
      return "avx512f";
    case Isa::avx512bf16:
      return "avx512bf16";
    case Isa::amx:
      return "amx";
  }
  return "?";
}

// Tile sizes of a pass, Megablox's (tm, tk, tn); 0 picks the family's default.
struct Tiles {
  std::int64_t m = 0;
  std::int64_t k = 0;
  std::int64_t n = 0;
};

// Quantization of an unquantized (f32 / bf16) operand done by the call itself: outside the
// kernel for v1, inside it for v2. The scale blocks run along the contraction axis with extent
// `block` (K for gmm, one scale per row and K block; M for tgmm, one scale per column and M
// block) and extent 1 across it. `block` 0 means the whole axis; a block larger than the axis is
// clamped to it; otherwise it must divide the axis. fixed calibration is per tensor and ignores
// `block`. tgmm's M blocks cover every row of the operand, owned by a local group or not (the
// whole tensor is quantized, as Qwix quantizes it): rows past sum(group_sizes) and other shards'
// rows count in their block's absmax, so they must hold finite values (zeros, say).
struct QuantSpec {
  QType qtype = QType::float8_e4m3fn;
  Calibration calibration;
  std::int64_t block = 512;
};

// What one operand looked like when it entered the kernel.
struct OperandTrace {
  DType dtype = DType::f32;  // element type the kernel read (the qtype if quantized)
  bool quantized = false;    // true if fp32 scales were applied
  BlockShape block;          // scale block (meaningful when quantized)
  std::string quantized_by;  // "caller", "outside kernel" (v1), "in kernel" (v2) or ""
};

// What a single gmm / tgmm call actually ran: tests use it to prove the routing of each pass.
struct CallTrace {
  std::string op;  // "gmm" or "tgmm"
  Family family = Family::v1;
  Isa isa = Isa::scalar;
  Tiles tiles;
  int threads = 1;
  OperandTrace lhs;
  OperandTrace rhs;
  // Peak bytes allocated beyond the outputs, including buffers v2's streaming kernels keep per
  // worker thread for later calls.
  std::int64_t extra_bytes = 0;
  std::int64_t streamed_tasks = 0;  // v2: tasks of a few rows read from unpacked weights
  // v2: the output was written with non-temporal stores (when its rows follow each other off
  // the cache lines, only the whole rows a task writes at once, as tgmm's short groups do)
  bool output_past_caches = false;
};

// Options of gmm::gmm and gmm::tgmm.
struct Options {
  Family family = Family::v2;
  std::int64_t group_offset = 0;          // first global expert held by this call
  bool transpose_rhs = false;             // gmm only: rhs is [G, N, K]
  bool accumulate = false;                // out += result, rows / blocks outside groups untouched
  std::optional<QuantSpec> quantize_lhs;  // quantize the lhs (activations) in the call
  std::optional<QuantSpec> quantize_rhs;  // tgmm only: quantize the rhs (output gradient)
  Tiles tiles;
  int threads = 0;  // 0: all hardware threads
  Isa isa = Isa::automatic;
  CallTrace* trace = nullptr;  // filled when non-null
};

}  // namespace gmm
