// AVX2 + FMA path: an fp32 FMA micro-kernel (bf16 / fp8 / int8 values are widened exactly).
#pragma once

#include <cstdint>

#include "gmm/kernels/cpu.hpp"
#include "gmm/kernels/format.hpp"
#include "gmm/kernels/reference.hpp"

#if GMM_KERNELS_X86
#define GMM_TARGET_AVX2 __attribute__((target("avx2,fma")))

namespace gmm::kernels {

// kMr x (8 * kNv) fp32 accumulators; per step one broadcast of A per row (lane-major A panel),
// kNv loads of B.
template <int kMr, int kNv>
GMM_TARGET_AVX2 void kernel_avx2_f32(std::int64_t steps, const void* a_packed, const void* b_packed,
                                     float* c, std::int64_t ldc, const float* row_scales,
                                     const float* col_scales, bool first, int rows) {
  const float* a = static_cast<const float*>(a_packed);
  const float* b = static_cast<const float*>(b_packed);
  __m256 acc[kMr][kNv];
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) acc[i][v] = _mm256_setzero_ps();
  }
  for (std::int64_t s = 0; s < steps; ++s, ++a, b += 8 * kNv) {
    __m256 bv[kNv];
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) bv[v] = _mm256_loadu_ps(b + 8 * v);
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) {
      const __m256 av = _mm256_broadcast_ss(a + i * steps);
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) acc[i][v] = _mm256_fmadd_ps(av, bv[v], acc[i][v]);
    }
  }
  __m256 cs[kNv];
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v) cs[v] = _mm256_loadu_ps(col_scales + 8 * v);
#pragma GCC unroll 16
  for (int i = 0; i < rows; ++i) {
    const __m256 rs = _mm256_broadcast_ss(row_scales + i);
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) {
      float* out = c + i * ldc + 8 * v;
      const __m256 scaled = _mm256_mul_ps(_mm256_mul_ps(acc[i][v], rs), cs[v]);
      _mm256_storeu_ps(out, first ? scaled : _mm256_add_ps(_mm256_loadu_ps(out), scaled));
    }
  }
}

// The AVX2 path: fp32 values and a 6 x 16 FMA kernel.
inline KernelKit avx2_kit() {
  KernelKit kit;
  kit.isa = Isa::avx2;
  kit.format = {PackedElement::f32, 6, 16, 1};
  kit.pack_a = pack_reference<PackedElement::f32, 1, PanelOrder::lane_major>;
  kit.pack_b = pack_reference<PackedElement::f32, 1, PanelOrder::step_major>;
  kit.kernel = kernel_avx2_f32<6, 2>;
  kit.stream = stream_reference;
  kit.stream_rows = four_stream_rows;
  kit.absmax = absmax_reference;
  kit.tiles = {96, 256, 512};
  return kit;
}

}  // namespace gmm::kernels
#endif
