// Picks the kernel kit of an ISA path for a problem's data: bf16 dot product or fp32 FMA.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <limits>

#include "gmm/kernels/amx.hpp"
#include "gmm/kernels/avx2.hpp"
#include "gmm/kernels/avx512.hpp"
#include "gmm/kernels/cpu.hpp"
#include "gmm/kernels/format.hpp"
#include "gmm/kernels/reference.hpp"

namespace gmm::kernels {

// The kit an ISA path runs. `bf16_exact` says both operands enter the product exactly
// representable in bf16 (bf16, fp8, int8, or quantized in the kernel); otherwise (an fp32
// operand) the fp32 FMA kernel of the widest fp32 path at or below `isa` runs, so fp32 values are
// never rounded. The kit's `isa` is the path whose kernel actually runs.
inline KernelKit select_kit(Isa isa, bool bf16_exact) {
#if GMM_KERNELS_X86
  switch (isa) {
    case Isa::amx:
      return bf16_exact ? amx_kit() : avx512f_kit();
    case Isa::avx512bf16:
      return bf16_exact ? avx512bf16_kit() : avx512f_kit();
    case Isa::avx512f:
      return avx512f_kit();
    case Isa::avx2:
      return avx2_kit();
    case Isa::automatic:
    case Isa::scalar:
      break;
  }
#else
  (void)isa;
  (void)bf16_exact;
#endif
  return scalar_kit();
}

// Contractions shorter than this (tgmm's groups of one or two rows, as in decode) leave the AMX
// kit to the path automatic takes without AMX: AMX pads the contraction to a 32-index tile step
// and pays a whole 32 x 32 tile epilogue per product, where the AVX-512 kits' output kernels store
// their rows straight from registers. fp8 drhs, K = N = 4096, 8 groups of r rows, 2 threads on a
// Sapphire Rapids-class VM, ms, AMX against AVX-512F: r = 1: 10.3-11.6 against 6.7-7.1, r = 2:
// 10.6-11.3 against 6.9-7.6, r = 3: 10.3-11.3 against 7.6-8.6, r = 4: 9.5-11.0 against 8.3-8.9,
// r = 6 level, r = 8: 10.1-10.5 against 11.5-11.7. The bound stays at two so that the choice
// changes no bits: products of fp8 or bf16 values are exact in fp32, and two of them are summed
// with one rounding on every path (except where subnormal inputs or sums appear, which AMX takes as
// zero); AMX adds three or more in another order than the FMA kernel (5 of 2M fp8 elements
// differed with three rows), and a group's result would then depend on the other groups' sizes.
constexpr std::int64_t kAmxShortestContraction = 3;

// The kit of a call: `requested` is Options::isa. A forced path (option or GMM_ISA) runs its
// own kernels; automatic runs the widest path, except that bf16-exact data takes the AVX-512F
// fp32 FMA kernel where vdpbf16ps is the slower of the two (CpuFeatures::bf16_dot_beats_fma),
// and that a call whose longest contraction is shorter than kAmxShortestContraction passes over
// AMX.
inline KernelKit call_kit(
    const char* where, Isa requested, bool bf16_exact, const CpuFeatures& features = cpu_features(),
    std::int64_t longest_contraction = std::numeric_limits<std::int64_t>::max()) {
  Isa isa = resolve_isa(where, requested, features);
  const char* env = std::getenv("GMM_ISA");
  const bool forced = requested != Isa::automatic || (env != nullptr && *env != '\0');
  if (!forced && isa == Isa::amx && longest_contraction < kAmxShortestContraction) {
    isa = Isa::avx512bf16;
  }
  if (!forced && isa == Isa::avx512bf16 && !features.bf16_dot_beats_fma) {
    return select_kit(Isa::avx512f, bf16_exact);
  }
  return select_kit(isa, bf16_exact);
}

}  // namespace gmm::kernels
