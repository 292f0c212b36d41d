// AVX-512 paths: an fp32 FMA micro-kernel (AVX-512F) and a bf16 dot-product one (AVX512_BF16).
#pragma once

#include <cstdint>

#include "gmm/kernels/cpu.hpp"
#include "gmm/kernels/format.hpp"
#include "gmm/kernels/reference.hpp"

#if GMM_KERNELS_X86
#define GMM_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))
#define GMM_TARGET_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx512bf16")))

namespace gmm::kernels {

// Epilogue of the AVX-512 kernels: c (= or +=) acc * row_scale * col_scales, one row.
template <int kNv>
GMM_TARGET_AVX512 inline void store_row_avx512(float* c, const __m512 (&acc)[kNv], float row_scale,
                                               const __m512 (&col_scales)[kNv], bool first) {
  const __m512 rs = _mm512_set1_ps(row_scale);
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v) {
    float* out = c + 16 * v;
    const __m512 scaled = _mm512_mul_ps(_mm512_mul_ps(acc[v], rs), col_scales[v]);
    _mm512_storeu_ps(out, first ? scaled : _mm512_add_ps(_mm512_loadu_ps(out), scaled));
  }
}

// kMr x (16 * kNv) fp32 accumulators; per step one broadcast of A per row, kNv loads of B.
template <int kMr, int kNv>
GMM_TARGET_AVX512 void kernel_avx512_f32(std::int64_t steps, const void* a_packed,
                                         const void* b_packed, float* c, std::int64_t ldc,
                                         const float* row_scales, const float* col_scales,
                                         bool first) {
  const float* a = static_cast<const float*>(a_packed);
  const float* b = static_cast<const float*>(b_packed);
  __m512 acc[kMr][kNv];
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  for (std::int64_t s = 0; s < steps; ++s, a += kMr, b += 16 * kNv) {
    __m512 bv[kNv];
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) bv[v] = _mm512_loadu_ps(b + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) {
      const __m512 av = _mm512_set1_ps(a[i]);
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
    }
  }
  __m512 cs[kNv];
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v) cs[v] = _mm512_loadu_ps(col_scales + 16 * v);
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i)
    store_row_avx512<kNv>(c + i * ldc, acc[i], row_scales[i], cs, first);
}

// kMr x (16 * kNv) fp32 accumulators fed by vdpbf16ps: per step (a pair of contraction
// indices) one 32-bit broadcast of A's bf16 pair per row and kNv loads of B's pairs. Products
// of bf16 values are exact in fp32; the instruction treats bf16 subnormals as zero.
template <int kMr, int kNv>
GMM_TARGET_AVX512BF16 void kernel_avx512_bf16(std::int64_t steps, const void* a_packed,
                                              const void* b_packed, float* c, std::int64_t ldc,
                                              const float* row_scales, const float* col_scales,
                                              bool first) {
  const std::uint16_t* a = static_cast<const std::uint16_t*>(a_packed);
  const std::uint16_t* b = static_cast<const std::uint16_t*>(b_packed);
  __m512 acc[kMr][kNv];
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  for (std::int64_t s = 0; s < steps; ++s, a += 2 * kMr, b += 32 * kNv) {
    __m512i bv[kNv];
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) bv[v] = _mm512_loadu_si512(b + 32 * v);
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) {
      std::int32_t pair;
      std::memcpy(&pair, a + 2 * i, sizeof pair);
      const __m512i av = _mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) {
        acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)av, (__m512bh)bv[v]);
      }
    }
  }
  __m512 cs[kNv];
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v) cs[v] = _mm512_loadu_ps(col_scales + 16 * v);
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i)
    store_row_avx512<kNv>(c + i * ldc, acc[i], row_scales[i], cs, first);
}

// The AVX-512F path: fp32 values (bf16 / fp8 / int8 widened exactly) and a 12 x 32 FMA kernel.
inline KernelKit avx512f_kit() {
  KernelKit kit;
  kit.isa = Isa::avx512f;
  kit.format = {PackedElement::f32, 12, 32, 1};
  kit.pack = pack_reference<PackedElement::f32, 1>;
  kit.kernel = kernel_avx512_f32<12, 2>;
  kit.tiles = {192, 256, 512};
  return kit;
}

// The AVX512_BF16 path for operands exact in bf16: bf16 pairs and an 8 x 32 vdpbf16ps kernel.
inline KernelKit avx512bf16_kit() {
  KernelKit kit;
  kit.isa = Isa::avx512bf16;
  kit.format = {PackedElement::bf16, 8, 32, 2};
  kit.pack = pack_reference<PackedElement::bf16, 2>;
  kit.kernel = kernel_avx512_bf16<8, 2>;
  kit.tiles = {192, 512, 512};
  return kit;
}

}  // namespace gmm::kernels
#endif
