// AVX-512 paths: an fp32 FMA micro-kernel (AVX-512F), a bf16 dot-product one (AVX512_BF16), and
// their vectorized packers (exact widening of bf16 / fp8 / int8, in-kernel quantization).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "gmm/kernels/cpu.hpp"
#include "gmm/kernels/format.hpp"
#include "gmm/kernels/reference.hpp"

#if GMM_KERNELS_X86
#define GMM_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))
#define GMM_TARGET_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx512bf16")))

GMM_KERNELS_SILENCE_UNDEFINED_WARNINGS

namespace gmm::kernels {

// ---- Exact widening and quantization of 16 elements --------------------------------------

// fp8 codes (one per 32-bit lane) to their exact fp32 values without touching fp32 subnormals:
// normal codes move their bits under the fp32 exponent and rebias it, subnormal codes convert
// their mantissa as an integer times the smallest subnormal; NaN codes give the canonical quiet
// NaN and e5m2 infinities stay infinite.
template <DType kFp8>
GMM_TARGET_AVX512 inline __m512 fp8_to_f32(__m512i code) {
  constexpr bool e4m3 = kFp8 == DType::float8_e4m3fn;
  const __m512i magnitude = _mm512_and_si512(code, _mm512_set1_epi32(0x7F));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(code, _mm512_set1_epi32(0x80)), 24);
  const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(magnitude, e4m3 ? 20 : 21),
                                          _mm512_set1_epi32(e4m3 ? 120 << 23 : 112 << 23));
  const __m512 subnormal =
      _mm512_mul_ps(_mm512_cvtepi32_ps(magnitude), _mm512_set1_ps(e4m3 ? 0x1p-9f : 0x1p-16f));
  const __mmask16 is_subnormal =
      _mm512_cmplt_epi32_mask(magnitude, _mm512_set1_epi32(e4m3 ? 8 : 4));
  __m512i bits = _mm512_mask_mov_epi32(normal, is_subnormal, _mm512_castps_si512(subnormal));
  if constexpr (e4m3) {
    const __mmask16 nan = _mm512_cmpeq_epi32_mask(magnitude, _mm512_set1_epi32(0x7F));
    bits = _mm512_mask_mov_epi32(bits, nan, _mm512_set1_epi32(0x7FC00000));
  } else {
    const __mmask16 inf = _mm512_cmpeq_epi32_mask(magnitude, _mm512_set1_epi32(0x7C));
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(0x7C));
    bits = _mm512_mask_mov_epi32(bits, inf, _mm512_set1_epi32(0x7F800000));
    bits = _mm512_mask_mov_epi32(bits, nan, _mm512_set1_epi32(0x7FC00000));
  }
  return _mm512_castsi512_ps(_mm512_or_si512(bits, sign));
}

// Exact fp32 values of the elements index .. index + 15 of a source (masked-off lanes are 0).
template <DType kDtype>
GMM_TARGET_AVX512 inline __m512 load16(const void* base, std::int64_t index, __mmask16 mask) {
  if constexpr (kDtype == DType::f32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + index);
  } else if constexpr (kDtype == DType::bf16) {
    const __m256i h =
        _mm256_maskz_loadu_epi16(mask, static_cast<const std::uint16_t*>(base) + index);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    const __m128i b = _mm_maskz_loadu_epi8(mask, static_cast<const std::uint8_t*>(base) + index);
    if constexpr (kDtype == DType::int8) {
      return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    } else {
      return fp8_to_f32<kDtype>(_mm512_cvtepu8_epi32(b));
    }
  }
}

// The same 16 values as a gather with an element stride (transposing sources).
template <DType kDtype>
GMM_TARGET_AVX512 inline __m512 load16_strided(const void* base, std::int64_t index,
                                               std::int64_t stride, __mmask16 mask) {
  alignas(64) float lanes[16];
  for (int i = 0; i < 16; ++i) {
    lanes[i] = ((mask >> i) & 1) ? load_as_float(base, kDtype, index + i * stride) : 0.0f;
  }
  return _mm512_load_ps(lanes);
}

// Rounds fp32 values (already clipped to the format's range) to the nearest fp8 value, ties to
// even, subnormals included, exactly as core/fp8.hpp's encoder followed by a decode: normal
// values add half an ulp minus one plus their lowest kept bit to their bits and truncate (the sign
// bit is never reached below the clip); subnormal ones are rounded to a multiple of the smallest
// subnormal by vrndscaleps (which keeps the sign of zero). Identical to the former sign-and-
// magnitude form (16 operations against 11 here) on all 2^32 inputs after the clip.
template <QType kQ>
GMM_TARGET_AVX512 inline __m512 round_to_fp8(__m512 q) {
  constexpr bool e4m3 = kQ == QType::float8_e4m3fn;
  constexpr int shift = e4m3 ? 20 : 21;
  const __m512i bits = _mm512_castps_si512(q);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, shift), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_andnot_si512(
      _mm512_set1_epi32((1 << shift) - 1),
      _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32((1 << (shift - 1)) - 1)), odd));
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  __m512 subnormal;
  if constexpr (e4m3) {  // multiples of 2^-9
    subnormal = _mm512_roundscale_ps(q, (9 << 4) | kNearest);
  } else {  // multiples of 2^-16: vrndscaleps keeps at most 15 fraction bits, so of 2q, 2^-15
    subnormal = _mm512_mul_ps(
        _mm512_roundscale_ps(_mm512_mul_ps(q, _mm512_set1_ps(2.0f)), (15 << 4) | kNearest),
        _mm512_set1_ps(0.5f));
  }
  const __mmask16 normal =
      _mm512_cmp_ps_mask(_mm512_abs_ps(q), _mm512_set1_ps(e4m3 ? 0x1p-6f : 0x1p-14f), _CMP_GE_OQ);
  const __mmask16 nan = _mm512_cmp_ps_mask(q, q, _CMP_UNORD_Q);
  const __m512 value = _mm512_mask_mov_ps(subnormal, normal, _mm512_castsi512_ps(rounded));
  return _mm512_mask_mov_ps(value, nan, _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
}

// A vector of quantization scales with what the quotient x / scale needs: the correctly
// rounded reciprocals and which lanes' scales lie in [2^-40, 2^40].
struct QuantScale {
  __m512 scale, reciprocal;
  __mmask16 moderate;
};

GMM_TARGET_AVX512 inline __mmask16 moderate_scales(__m512 scale) {
  return _mm512_cmp_ps_mask(scale, _mm512_set1_ps(0x1p-40f), _CMP_GE_OQ) &
         _mm512_cmp_ps_mask(scale, _mm512_set1_ps(0x1p40f), _CMP_LE_OQ);
}

GMM_TARGET_AVX512 inline QuantScale make_quant_scale(__m512 scale) {
  return {scale, _mm512_div_ps(_mm512_set1_ps(1.0f), scale), moderate_scales(scale)};
}

// x / scale correctly rounded, as a division gives it, at the cost of a multiply and two FMAs:
// with r = RN(1 / s), q = RN(x r) and the exact remainder e = x - q s (one FMA),
// RN(q + e r) = RN(x / s) (Markstein's theorem) whenever nothing underflows or overflows, which
// |x| in [2^-60, 2^60] and s in [2^-40, 2^40] guarantee; other lanes (zeros, NaN, inf, extreme
// magnitudes) take the division.
GMM_TARGET_AVX512 inline __m512 divide16(__m512 x, const QuantScale& s) {
  const __m512 magnitude = _mm512_abs_ps(x);
  const __mmask16 fast = s.moderate &
                         _mm512_cmp_ps_mask(magnitude, _mm512_set1_ps(0x1p-60f), _CMP_GE_OQ) &
                         _mm512_cmp_ps_mask(magnitude, _mm512_set1_ps(0x1p60f), _CMP_LE_OQ);
  const __m512 q = _mm512_mul_ps(x, s.reciprocal);
  const __m512 remainder = _mm512_fnmadd_ps(q, s.scale, x);
  const __m512 quotient = _mm512_fmadd_ps(remainder, s.reciprocal, q);
  if (fast == 0xFFFF) return quotient;
  return _mm512_mask_div_ps(quotient, static_cast<__mmask16>(~fast), x, s.scale);
}

// Quantized values (without the scale) of 16 fp32 inputs: cast(clip(x / scale)), the exact
// rules of core/qvalue.hpp (the quotient of a division, NaN passing the clip, int8 NaN stored as
// 0).
template <QType kQ>
GMM_TARGET_AVX512 inline __m512 quantize16(__m512 x, const QuantScale& scale) {
  const __m512 bound = _mm512_set1_ps(qmax(kQ));
  __m512 q = divide16(x, scale);
  q = _mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), bound), _mm512_min_ps(bound, q));
  if constexpr (kQ == QType::int8) {
    const __mmask16 number = _mm512_cmp_ps_mask(q, q, _CMP_ORD_Q);
    return _mm512_maskz_cvtepi32_ps(number, _mm512_cvtps_epi32(q));
  } else {
    return round_to_fp8<kQ>(q);
  }
}

// The values a packer reads: widened, and quantized when the source asks for it.
struct LoadQuantized {
  template <DType kDtype, QType kQ, bool kQuantize>
  GMM_TARGET_AVX512 static __m512 run(const void* base, std::int64_t index, std::int64_t stride,
                                      __mmask16 mask, const QuantScale& scale) {
    const __m512 x = stride == 1 ? load16<kDtype>(base, index, mask)
                                 : load16_strided<kDtype>(base, index, stride, mask);
    if constexpr (kQuantize) {
      return quantize16<kQ>(x, scale);
    } else {
      (void)scale;
      return x;
    }
  }
};

// Quantization scales of lanes lane .. lane + 15 (1 past `lanes`); only computed when quantizing.
template <bool kQuantize>
GMM_TARGET_AVX512 inline QuantScale lane_quant_scale(const float* lane_scales, std::int64_t lane,
                                                     std::int64_t lanes) {
  if constexpr (!kQuantize) {
    return {_mm512_setzero_ps(), _mm512_setzero_ps(), 0};
  } else {
    const __mmask16 live = lanes - lane >= 16 ? static_cast<__mmask16>(0xFFFF)
                           : lanes <= lane    ? static_cast<__mmask16>(0)
                                              : static_cast<__mmask16>((1u << (lanes - lane)) - 1);
    return make_quant_scale(_mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), live, lane_scales + lane));
  }
}

inline __mmask16 first_lanes(std::int64_t count) {
  return count >= 16  ? static_cast<__mmask16>(0xFFFF)
         : count <= 0 ? static_cast<__mmask16>(0)
                      : static_cast<__mmask16>((1u << count) - 1);
}

inline __mmask32 first_words(std::int64_t count) {
  return count >= 32  ? static_cast<__mmask32>(0xFFFFFFFFu)
         : count <= 0 ? static_cast<__mmask32>(0)
                      : static_cast<__mmask32>((1u << count) - 1);
}

inline __mmask64 first_bytes(std::int64_t count) {
  return count >= 64  ? static_cast<__mmask64>(~0ull)
         : count <= 0 ? static_cast<__mmask64>(0)
                      : static_cast<__mmask64>((1ull << count) - 1);
}

// bf16 bits of 16 values exact in bf16 (canonical NaNs), as 16 words.
GMM_TARGET_AVX512 inline __m256i to_bf16_words(__m512 v) {
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16));
}

// bf16 pairs (a in the low half, b in the high half) of 16 pairs of values exact in bf16.
GMM_TARGET_AVX512 inline __m512i to_bf16_pairs(__m512 a, __m512 b) {
  return _mm512_or_si512(
      _mm512_and_si512(_mm512_castps_si512(b), _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))),
      _mm512_srli_epi32(_mm512_castps_si512(a), 16));
}

// ---- Packers ------------------------------------------------------------------------------

// Transposes a 16 x 16 fp32 tile held in 16 registers (64 shuffles).
GMM_TARGET_AVX512 inline void transpose16(__m512 (&r)[16]) {
  __m512 a[16], b[16];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    a[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    a[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  // b[4k + c], 128-bit lane L: rows 4k .. 4k + 3 at column 4L + c
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    b[4 * k] = _mm512_shuffle_ps(a[4 * k], a[4 * k + 2], 0x44);
    b[4 * k + 1] = _mm512_shuffle_ps(a[4 * k], a[4 * k + 2], 0xEE);
    b[4 * k + 2] = _mm512_shuffle_ps(a[4 * k + 1], a[4 * k + 3], 0x44);
    b[4 * k + 3] = _mm512_shuffle_ps(a[4 * k + 1], a[4 * k + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512 low_x = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x44);
    const __m512 high_x = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xEE);
    const __m512 low_y = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x44);
    const __m512 high_y = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xEE);
    r[c] = _mm512_shuffle_f32x4(low_x, low_y, 0x88);
    r[4 + c] = _mm512_shuffle_f32x4(low_x, low_y, 0xDD);
    r[8 + c] = _mm512_shuffle_f32x4(high_x, high_y, 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(high_x, high_y, 0xDD);
  }
}

// Packs panels from a source laid out across the panel order (A panels of a source whose lanes
// are contiguous, B panels of one whose contraction runs are): 16 x 16 tiles are read as
// contiguous runs, widened / quantized, transposed in registers and stored.
template <PackedElement kElement, PanelOrder kOrder, int kStepMultiple, DType kDtype, QType kQ,
          bool kQuantize>
GMM_TARGET_AVX512 void pack_avx512_transposing(const PanelSource& src, int width,
                                               std::int64_t lane0, std::int64_t lanes,
                                               std::int64_t k0, std::int64_t kc,
                                               const float* lane_scales, void* out) {
  constexpr int depth = kElement == PackedElement::bf16 ? 2 : 1;
  constexpr bool runs_along_lanes = kOrder == PanelOrder::lane_major;
  using Element = std::conditional_t<kElement == PackedElement::f32, float, std::uint16_t>;
  const std::int64_t steps =
      ((kc + depth - 1) / depth + kStepMultiple - 1) / kStepMultiple * kStepMultiple;
  const std::int64_t padded_k = steps * depth;
  const std::int64_t panels = (lanes + width - 1) / width, panel_lanes = panels * width;
  Element* const packed = static_cast<Element*>(out);
  const auto at = [&](std::int64_t lane, std::int64_t step) {  // element (lane, step, 0)
    return packed + (lane / width) * padded_k * width +
           (runs_along_lanes ? (lane % width) * padded_k + step * depth
                             : (step * width + lane % width) * depth);
  };
  for (std::int64_t lane = 0; lane < panel_lanes; lane += 16) {
    const __mmask16 live = first_lanes(lanes - lane);
    const QuantScale lane_scale = lane_quant_scale<kQuantize>(lane_scales, lane, lanes);
    QuantScale run_scales[16];  // runs along the contraction: one lane's scale each
    if constexpr (kQuantize && !runs_along_lanes) {
      for (int i = 0; i < 16; ++i) {
        run_scales[i] =
            make_quant_scale(_mm512_set1_ps(((live >> i) & 1) ? lane_scales[lane + i] : 1.0f));
      }
    }
    if constexpr (kElement == PackedElement::bf16 && runs_along_lanes) {
      // 32 contraction indices at a time: runs k + 2i and k + 2i + 1 make register i's bf16
      // pairs, and one 16 x 16 transpose of the pairs leaves each lane's 32 words in a register
      // (half the shuffles per value of transposing fp32 and narrowing to words afterwards).
      // tgmm's A side, bf16 source quantized to fp8, 2048 lanes, 1 thread, ns per packed value:
      // 64 indices 0.47-0.48 -> 0.39-0.45, 16 indices 0.48 -> 0.23 (unquantized, 64 indices:
      // 0.25 -> 0.14). Fp8 drhs, 2 threads, ms: dsv3-up 20.3-22.4 -> 16.8-18.9, qwen3-30b
      // 7.5-7.9 -> 7.1-7.3, skewed level (21.4-22.3).
      for (std::int64_t k = 0; k < padded_k; k += 32) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) {
          const std::int64_t index = k + 2 * i;
          if (index >= kc) {
            r[i] = _mm512_setzero_ps();
            continue;
          }
          const std::int64_t offset =
              (lane0 + lane) * src.lane_stride + (k0 + index) * src.k_stride;
          const __m512 even =
              LoadQuantized::run<kDtype, kQ, kQuantize>(src.data, offset, 1, live, lane_scale);
          const __m512 odd = LoadQuantized::run<kDtype, kQ, kQuantize>(
              src.data, offset + src.k_stride, 1, index + 1 < kc ? live : 0, lane_scale);
          r[i] = _mm512_castsi512_ps(to_bf16_pairs(even, odd));
        }
        transpose16(r);
        const __mmask32 store = first_words(padded_k - k);
        for (int l = 0; l < 16 && lane + l < panel_lanes; ++l) {
          _mm512_mask_storeu_epi16(at(lane + l, 0) + k, store, _mm512_castps_si512(r[l]));
        }
      }
    } else {
      for (std::int64_t k = 0; k < padded_k; k += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) {
          if (runs_along_lanes) {  // run i: contraction index k + i, 16 lanes
            const __mmask16 valid = k + i < kc ? live : 0;
            r[i] = LoadQuantized::run<kDtype, kQ, kQuantize>(
                src.data, (lane0 + lane) * src.lane_stride + (k0 + k + i) * src.k_stride, 1, valid,
                lane_scale);
          } else {  // run i: lane + i, 16 contraction indices
            const __mmask16 valid = ((live >> i) & 1) ? first_lanes(kc - k) : 0;
            r[i] = LoadQuantized::run<kDtype, kQ, kQuantize>(
                src.data, (lane0 + lane + i) * src.lane_stride + (k0 + k) * src.k_stride, 1, valid,
                run_scales[i]);
          }
        }
        transpose16(r);
        if constexpr (runs_along_lanes) {  // f32 (bf16 above): lane + l over k .. k + 15
          const __mmask16 store = first_lanes(padded_k - k);
          for (int l = 0; l < 16 && lane + l < panel_lanes; ++l) {
            _mm512_mask_storeu_ps(at(lane + l, 0) + k, store, r[l]);
          }
        } else {  // r[j]: contraction index k + j over lanes lane .. lane + 15
          for (int j = 0; j < 16 && k + j < padded_k; j += depth) {
            Element* dst = at(lane, (k + j) / depth);
            if constexpr (kElement == PackedElement::f32) {
              _mm512_storeu_ps(dst, r[j]);
            } else {
              _mm512_storeu_si512(dst, to_bf16_pairs(r[j], r[j + 1]));
            }
          }
        }
      }
    }
  }
}

// Contraction steps the B packers pack lane group after lane group (see pack_avx512_typed).
constexpr std::int64_t kPackStepBlock = 8;

// Packs panels. A panels (lane-major) read each lane's contraction run; B panels (step-major)
// read contraction index by index across all panels' lanes, so a source with contiguous lanes
// is read in long sequential runs; a source laid out the other way round is read with a stride.
template <PackedElement kElement, PanelOrder kOrder, int kStepMultiple, DType kDtype, QType kQ,
          bool kQuantize>
GMM_TARGET_AVX512 void pack_avx512_typed(const PanelSource& src, int width, std::int64_t lane0,
                                         std::int64_t lanes, std::int64_t k0, std::int64_t kc,
                                         const float* lane_scales, void* out) {
  constexpr int depth = kElement == PackedElement::bf16 ? 2 : 1;
  using Element = std::conditional_t<kElement == PackedElement::f32, float, std::uint16_t>;
  const std::int64_t steps =
      ((kc + depth - 1) / depth + kStepMultiple - 1) / kStepMultiple * kStepMultiple;
  const std::int64_t padded_k = steps * depth;
  const std::int64_t panels = (lanes + width - 1) / width;
  Element* const packed = static_cast<Element*>(out);
  if constexpr (kOrder == PanelOrder::lane_major) {
    for (std::int64_t lane = 0; lane < panels * width; ++lane) {
      Element* dst = packed + (lane / width) * padded_k * width + (lane % width) * padded_k;
      const bool live = lane < lanes;
      QuantScale scale{};
      if constexpr (kQuantize)
        scale = make_quant_scale(_mm512_set1_ps(live ? lane_scales[lane] : 1.0f));
      const std::int64_t base = (lane0 + lane) * src.lane_stride + k0 * src.k_stride;
      for (std::int64_t k = 0; k < padded_k; k += 16) {
        const __mmask16 valid = live ? first_lanes(kc - k) : 0;
        const __mmask16 store = first_lanes(padded_k - k);
        const __m512 v = LoadQuantized::run<kDtype, kQ, kQuantize>(
            src.data, base + k * src.k_stride, src.k_stride, valid, scale);
        if constexpr (kElement == PackedElement::f32) {
          _mm512_mask_storeu_ps(dst + k, store, v);
        } else {
          _mm256_mask_storeu_epi16(dst + k, store, to_bf16_words(v));
        }
      }
    }
  } else {
    std::vector<float> reciprocals;  // of the lanes' scales, computed once for all steps
    if constexpr (kQuantize) {
      reciprocals.resize(static_cast<std::size_t>(lanes));
      for (std::int64_t lane = 0; lane < lanes; ++lane)
        reciprocals[lane] = 1.0f / lane_scales[lane];
    }
    // Steps in blocks of kPackStepBlock, 16 lanes after 16 lanes within a block: the stores of
    // one step to all panels would lie a whole panel apart (one L1 set), a lane group's stay
    // sequential; the block's source rows stay in L1, and the next block's are prefetched.
    const std::int64_t element = static_cast<std::int64_t>(size_of(kDtype));
    for (std::int64_t s0 = 0; s0 < steps; s0 += kPackStepBlock) {
      const std::int64_t s1 = std::min(steps, s0 + kPackStepBlock);
      const std::int64_t ahead0 = (s0 + kPackStepBlock) * depth;
      const std::int64_t ahead1 = std::min(kc, ahead0 + kPackStepBlock * depth);
      for (std::int64_t lane = 0; lane < panels * width; lane += 16) {
        const __mmask16 live = first_lanes(lanes - lane);
        QuantScale scale{};
        if constexpr (kQuantize) {
          scale.scale = _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), live, lane_scales + lane);
          scale.reciprocal =
              _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), live, reciprocals.data() + lane);
          scale.moderate = moderate_scales(scale.scale);
        }
        if (src.lane_stride == 1 && (lane * element) % 64 == 0) {
          for (std::int64_t row = ahead0; row < ahead1; ++row) {
            _mm_prefetch(static_cast<const char*>(src.data) +
                             ((lane0 + lane) + (k0 + row) * src.k_stride) * element,
                         _MM_HINT_T0);
          }
        }
        for (std::int64_t s = s0; s < s1; ++s) {
          Element* dst =
              packed + (lane / width) * padded_k * width + (s * width + lane % width) * depth;
          const __mmask16 valid = s * depth < kc ? live : 0;
          const std::int64_t base =
              (lane0 + lane) * src.lane_stride + (k0 + s * depth) * src.k_stride;
          const __m512 v0 = LoadQuantized::run<kDtype, kQ, kQuantize>(
              src.data, base, src.lane_stride, valid, scale);
          if constexpr (kElement == PackedElement::f32) {
            _mm512_storeu_ps(dst, v0);
          } else {
            const __mmask16 second = s * 2 + 1 < kc ? live : 0;
            const __m512 v1 = LoadQuantized::run<kDtype, kQ, kQuantize>(
                src.data, base + src.k_stride, src.lane_stride, second, scale);
            _mm512_storeu_si512(dst, to_bf16_pairs(v0, v1));
          }
        }
      }
    }
  }
}

// Dispatches a packer on the source dtype and quantization.
template <PackedElement kElement, PanelOrder kOrder, int kStepMultiple = 1>
GMM_TARGET_AVX512 void pack_avx512(const PanelSource& src, int width, std::int64_t lane0,
                                   std::int64_t lanes, std::int64_t k0, std::int64_t kc,
                                   const float* lane_scales, void* out) {
  const bool transposing =
      kOrder == PanelOrder::lane_major ? src.k_stride != 1 : src.lane_stride != 1;
#define GMM_PACK(D, Q, QUANTIZE)                                                                 \
  return transposing ? pack_avx512_transposing<kElement, kOrder, kStepMultiple, D, Q, QUANTIZE>( \
                           src, width, lane0, lanes, k0, kc, lane_scales, out)                   \
                     : pack_avx512_typed<kElement, kOrder, kStepMultiple, D, Q, QUANTIZE>(       \
                           src, width, lane0, lanes, k0, kc, lane_scales, out)
  constexpr QType e4 = QType::float8_e4m3fn;
  if (src.quantize) {
    const bool f32 = src.dtype == DType::f32;
    switch (src.qtype) {
      case QType::float8_e4m3fn:
        if (f32) GMM_PACK(DType::f32, e4, true);
        GMM_PACK(DType::bf16, e4, true);
      case QType::float8_e5m2:
        if (f32) GMM_PACK(DType::f32, QType::float8_e5m2, true);
        GMM_PACK(DType::bf16, QType::float8_e5m2, true);
      case QType::int8:
        if (f32) GMM_PACK(DType::f32, QType::int8, true);
        GMM_PACK(DType::bf16, QType::int8, true);
    }
  }
  switch (src.dtype) {
    case DType::f32:
      GMM_PACK(DType::f32, e4, false);
    case DType::bf16:
      GMM_PACK(DType::bf16, e4, false);
    case DType::float8_e4m3fn:
      GMM_PACK(DType::float8_e4m3fn, e4, false);
    case DType::float8_e5m2:
      GMM_PACK(DType::float8_e5m2, e4, false);
    case DType::int8:
      GMM_PACK(DType::int8, e4, false);
  }
#undef GMM_PACK
}

// Absmax of lanes over a contraction range: along each lane's run (contiguous contraction) or
// across lanes row by row (contiguous lanes); NaN anywhere makes that lane's absmax NaN.
template <DType kDtype>
GMM_TARGET_AVX512 void absmax_avx512_typed(const PanelSource& src, std::int64_t lane0,
                                           std::int64_t lanes, std::int64_t k_begin,
                                           std::int64_t k_end, float* absmax) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  if (src.k_stride == 1) {
    for (std::int64_t w = 0; w < lanes; ++w) {
      __m512 m = _mm512_setzero_ps();
      __mmask16 nan = 0;
      const std::int64_t base = (lane0 + w) * src.lane_stride;
      for (std::int64_t k = k_begin; k < k_end; k += 16) {
        const __m512 a =
            _mm512_andnot_ps(sign, load16<kDtype>(src.data, base + k, first_lanes(k_end - k)));
        nan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
        m = _mm512_max_ps(m, a);
      }
      absmax[w] = nan ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(m);
    }
  } else {  // lanes contiguous: sweep row by row, up to 256 lanes at a time
    constexpr std::int64_t kBlock = 256;
    // Every line of a row's lanes is prefetched this many rows ahead: rows a page apart (as
    // tgmm's K = 2048 bf16 activations) are each a few lines in a fresh page, which the hardware
    // prefetchers did not fetch ahead. Scratch, 2048 x 2048 bf16 in blocks of 512 rows x 256
    // lanes, 1 thread, GB/s: 10.4 with one line 4 rows ahead, 17.4 with every line 8 ahead (15.3
    // at 4, 15.2 at 16, 7.8 with none); 1408 lanes: 10.0 -> 16.4. tgmm's fp8 recipe, groups of
    // 256 rows, K = 2048, N = 1408, 1 thread, medians of four runs: 28.8-30.2 -> 27.9-28.5 ms.
    constexpr std::int64_t kRowsAhead = 8;
    const std::int64_t element = static_cast<std::int64_t>(size_of(kDtype));
    for (std::int64_t w0 = 0; w0 < lanes; w0 += kBlock) {
      const std::int64_t count = std::min(kBlock, lanes - w0);
      const std::int64_t row_span = src.lane_stride == 1 ? count * element : 1;  // else a line
      __m512 m[kBlock / 16];
      __mmask16 nan[kBlock / 16] = {};
      for (auto& v : m) v = _mm512_setzero_ps();
      for (std::int64_t k = k_begin; k < k_end; ++k) {
        const std::int64_t row = (lane0 + w0) * src.lane_stride + k * src.k_stride;
        if (k + kRowsAhead < k_end) {
          const char* ahead =
              static_cast<const char*>(src.data) + (row + kRowsAhead * src.k_stride) * element;
          for (std::int64_t b = 0; b < row_span; b += kCacheLineBytes) {
            _mm_prefetch(ahead + b, _MM_HINT_T0);
          }
        }
        for (std::int64_t v = 0; v * 16 < count; ++v) {
          const std::int64_t index = row + v * 16 * src.lane_stride;
          const __mmask16 valid = first_lanes(count - v * 16);
          const __m512 a = _mm512_andnot_ps(
              sign, src.lane_stride == 1
                        ? load16<kDtype>(src.data, index, valid)
                        : load16_strided<kDtype>(src.data, index, src.lane_stride, valid));
          nan[v] |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
          m[v] = _mm512_max_ps(m[v], a);
        }
      }
      for (std::int64_t v = 0; v * 16 < count; ++v) {
        const __m512 out = _mm512_mask_mov_ps(
            m[v], nan[v], _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
        _mm512_mask_storeu_ps(absmax + w0 + v * 16, first_lanes(count - v * 16), out);
      }
    }
  }
}

GMM_TARGET_AVX512 inline void absmax_avx512(const PanelSource& src, std::int64_t lane0,
                                            std::int64_t lanes, std::int64_t k_begin,
                                            std::int64_t k_end, float* absmax) {
  if (src.dtype == DType::f32) {
    absmax_avx512_typed<DType::f32>(src, lane0, lanes, k_begin, k_end, absmax);
  } else {
    absmax_avx512_typed<DType::bf16>(src, lane0, lanes, k_begin, k_end, absmax);
  }
}

// ---- Output epilogue -----------------------------------------------------------------------

// fp32 bits of x with each NaN (flagged in `nan`) made sign | 0x7FC00000: Eigen's bf16 NaN
// (0x7FC0 or 0xFFC0 by sign), which bf16_rounded_lanes leaves as it is.
GMM_TARGET_AVX512 inline __m512i bf16_canonical_nan(__m512 x, __mmask16 nan) {
  constexpr int kOrThenAnd = 0xA8;  // vpternlogd: (x | 0x7FC00000) & 0xFFC00000 where flagged
  return _mm512_mask_ternarylogic_epi32(_mm512_castps_si512(x), nan, _mm512_set1_epi32(0x7FC00000),
                                        _mm512_set1_epi32(static_cast<int>(0xFFC00000u)),
                                        kOrThenAnd);
}

// fp32 bits (no NaN) plus the round-to-nearest-even bias: each lane's upper 16 bits are then its
// bf16 value (0x7FFF, or 0x8000 when the kept part is odd, so that ties go to even).
GMM_TARGET_AVX512 inline __m512i bf16_rounded_lanes(__m512i bits) {
  const __mmask16 odd = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x10000));
  return _mm512_add_epi32(
      bits, _mm512_mask_blend_epi32(odd, _mm512_set1_epi32(0x7FFF), _mm512_set1_epi32(0x8000)));
}

// bf16 bits of 16 fp32 values rounded to nearest even, NaN as Eigen's bfloat16(float) gives it
// (0x7FC0 or 0xFFC0 by sign).
GMM_TARGET_AVX512 inline __m256i round_to_bf16_words(__m512 x) {
  const __m512i bits = bf16_canonical_nan(x, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_rounded_lanes(bits), 16));
}

// bf16 bits of 32 fp32 values (lo's first), rounded as round_to_bf16_words rounds them: the upper
// words of both vectors' rounded lanes gathered by one vpermt2w, the NaN fix only for pairs that
// hold one (one unordered compare of lo with hi finds them). On Ice Lake (a loop over 4096 values
// in L1), 2.8 TSC cycles per 16 values against 4.2 for round_to_bf16_words (and 5.8 for its former
// shift-and-mask form, which vpmovdw narrowed).
GMM_TARGET_AVX512 inline __m512i round_to_bf16_words(__m512 lo, __m512 hi) {
  __m512i lo_bits = _mm512_castps_si512(lo), hi_bits = _mm512_castps_si512(hi);
  if (_mm512_cmp_ps_mask(lo, hi, _CMP_UNORD_Q) != 0) {
    lo_bits = bf16_canonical_nan(lo, _mm512_cmp_ps_mask(lo, lo, _CMP_UNORD_Q));
    hi_bits = bf16_canonical_nan(hi, _mm512_cmp_ps_mask(hi, hi, _CMP_UNORD_Q));
  }
  // word j of the result: word 2j + 1 (an upper half) of the concatenation lo, hi
  const __m512i upper_words =
      _mm512_set_epi32(0x003F003D, 0x003B0039, 0x00370035, 0x00330031, 0x002F002D, 0x002B0029,
                       0x00270025, 0x00230021, 0x001F001D, 0x001B0019, 0x00170015, 0x00130011,
                       0x000F000D, 0x000B0009, 0x00070005, 0x00030001);
  return _mm512_permutex2var_epi16(bf16_rounded_lanes(lo_bits), upper_words,
                                   bf16_rounded_lanes(hi_bits));
}

// KernelKit::store_row of the AVX-512 paths: 16 values per step, masked at the row's end (bf16
// rows not added to: 32 values, a cache line, per step through round_to_bf16_words(lo, hi)); with
// bypass_cache, the whole cache lines of the row stream past the caches (vmovntps / vmovntdq)
// and the partial lines at its ends are stored as usual (a line written both ways is slow).
GMM_TARGET_AVX512 inline void store_row_avx512_out(const float* src, void* dst, DType dtype,
                                                   std::int64_t n, bool accumulate,
                                                   bool bypass_cache) {
  if (dtype == DType::bf16 && !accumulate && n >= 32) {
    auto* out = static_cast<std::uint16_t*>(dst);
    std::int64_t j = bypass_cache ? values_before_line(dst, 2, n) : 0;
    store_row_avx512_out(src, out, dtype, j, false, false);
    for (; j + 32 <= n; j += 32) {
      const __m512i words =
          round_to_bf16_words(_mm512_loadu_ps(src + j), _mm512_loadu_ps(src + j + 16));
      if (bypass_cache) {
        _mm512_stream_si512(reinterpret_cast<__m512i*>(out + j), words);
      } else {
        _mm512_storeu_si512(out + j, words);
      }
    }
    store_row_avx512_out(src + j, out + j, dtype, n - j, false, false);
    return;
  }
  if (dtype == DType::f32 && bypass_cache && !accumulate) {
    const std::int64_t head = values_before_line(dst, 4, n);
    const std::int64_t lines_end = head + (n - head) / 16 * 16;
    store_row_avx512_out(src, dst, dtype, head, false, false);
    for (std::int64_t j = head; j < lines_end; j += 16) {
      _mm512_stream_ps(static_cast<float*>(dst) + j, _mm512_loadu_ps(src + j));
    }
    store_row_avx512_out(src + lines_end, static_cast<float*>(dst) + lines_end, dtype,
                         n - lines_end, false, false);
    return;
  }
  for (std::int64_t j = 0; j < n; j += 16) {
    const __mmask16 mask = first_lanes(n - j);
    __m512 v = _mm512_maskz_loadu_ps(mask, src + j);
    if (dtype == DType::f32) {
      float* out = static_cast<float*>(dst) + j;
      if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), v);
      _mm512_mask_storeu_ps(out, mask, v);
    } else {
      std::uint16_t* out = static_cast<std::uint16_t*>(dst) + j;
      if (accumulate) {
        const __m256i old = _mm256_maskz_loadu_epi16(mask, out);
        v = _mm512_add_ps(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(old), 16)),
                          v);
      }
      _mm256_mask_storeu_epi16(out, mask, round_to_bf16_words(v));
    }
  }
}

// bf16 bits of 32 fp32 values (lo's first), rounded as round_to_bf16_words rounds them: one
// vcvtne2ps2bf16, which matches it on every value but subnormals (which it flushes to zero) and
// NaNs (whose payload it keeps); vectors holding those are rounded by round_to_bf16_words.
GMM_TARGET_AVX512BF16 inline __m512i round_to_bf16_words_bf16(__m512 lo, __m512 hi) {
  constexpr int kNanOrSubnormal = 0x01 | 0x80 | 0x20;  // vfpclassps: QNaN, SNaN, denormal
  if ((_mm512_fpclass_ps_mask(lo, kNanOrSubnormal) | _mm512_fpclass_ps_mask(hi, kNanOrSubnormal)) ==
      0) {
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
  }
  return round_to_bf16_words(lo, hi);
}

// KernelKit::store_row of the AVX512_BF16 path: store_row_avx512_out, with bf16 rows stored
// 32 values at a time through round_to_bf16_words_bf16.
GMM_TARGET_AVX512BF16 inline void store_row_avx512bf16_out(const float* src, void* dst, DType dtype,
                                                           std::int64_t n, bool accumulate,
                                                           bool bypass_cache) {
  if (dtype != DType::bf16 || accumulate) {
    store_row_avx512_out(src, dst, dtype, n, accumulate, bypass_cache);
    return;
  }
  auto* out = static_cast<std::uint16_t*>(dst);
  std::int64_t j = 0;
  if (bypass_cache) {  // up to the first line boundary as usual, then whole lines past the caches
    j = values_before_line(dst, 2, n);
    store_row_avx512_out(src, out, dtype, j, false, false);
  }
  for (; j + 32 <= n; j += 32) {
    const __m512i words =
        round_to_bf16_words_bf16(_mm512_loadu_ps(src + j), _mm512_loadu_ps(src + j + 16));
    if (bypass_cache) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out + j), words);
    } else {
      _mm512_storeu_si512(out + j, words);
    }
  }
  store_row_avx512_out(src + j, out + j, dtype, n - j, false, false);
}

// KernelKit::store_fence of the AVX-512 paths.
inline void store_fence_x86() { _mm_sfence(); }

// ---- Micro-kernels ------------------------------------------------------------------------

// Prefetches into L2 the rows of C a micro-kernel adds to (not first): issued before the
// contraction loop, so the epilogue does not wait on a tile of C that has left L2 (the
// AVX512_BF16 kit's task tile, 512 x 512 fp32, is the size of L2).
template <int kNv>
inline void prefetch_c_rows(const float* c, std::int64_t ldc, int rows, bool first) {
  if (first) return;
  for (int i = 0; i < rows; ++i) {
    for (int v = 0; v < kNv; ++v) prefetch_line_l2(c + i * ldc + 16 * v);
  }
}

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

// Epilogue of the AVX-512 micro-kernels: the tile's first `rows` rows into C (store_row_avx512).
template <int kMr, int kNv>
GMM_TARGET_AVX512 __attribute__((always_inline)) inline void store_tile_avx512(
    float* c, std::int64_t ldc, const __m512 (&acc)[kMr][kNv], const float* row_scales,
    const float* col_scales, bool first, int rows) {
  __m512 cs[kNv];
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v) cs[v] = _mm512_loadu_ps(col_scales + 16 * v);
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
    if (i < rows) store_row_avx512<kNv>(c + i * ldc, acc[i], row_scales[i], cs, first);
  }
}

// Vectors v and v + 1 of a row of an output kernel's tile, scaled: acc * row_scale * col_scales.
template <int kNv>
GMM_TARGET_AVX512 __attribute__((always_inline)) inline void scaled_pair(
    const __m512 (&acc)[kNv], __m512 row_scale, const __m512 (&col_scales)[kNv], int v, __m512& lo,
    __m512& hi) {
  lo = _mm512_mul_ps(_mm512_mul_ps(acc[v], row_scale), col_scales[v]);
  hi = _mm512_mul_ps(_mm512_mul_ps(acc[v + 1], row_scale), col_scales[v + 1]);
}

// Epilogue of the AVX-512F output kernel (KernelKit::output_kernel): the tile's first `rows`
// rows, acc * row_scale * col_scales rounded to the output's type as store_row rounds it (bf16: a
// cache line per pair of vectors), stored past the caches (each row's 16 * kNv values are whole,
// aligned cache lines of the output).
template <int kMr, int kNv>
GMM_TARGET_AVX512 __attribute__((always_inline)) inline void stream_out_tile_avx512(
    void* out, std::int64_t out_row_stride, DType dtype, const __m512 (&acc)[kMr][kNv],
    const float* row_scales, const float* col_scales, int rows) {
  static_assert(kNv % 2 == 0, "bf16 rows are stored a cache line (two vectors) at a time");
  __m512 cs[kNv];
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v) cs[v] = _mm512_loadu_ps(col_scales + 16 * v);
  const std::int64_t row_bytes = out_row_stride * static_cast<std::int64_t>(size_of(dtype));
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
    if (i >= rows) break;
    unsigned char* row = static_cast<unsigned char*>(out) + i * row_bytes;
    const __m512 rs = _mm512_set1_ps(row_scales[i]);
#pragma GCC unroll 4
    for (int v = 0; v < kNv; v += 2) {
      __m512 lo, hi;
      scaled_pair<kNv>(acc[i], rs, cs, v, lo, hi);
      if (dtype == DType::f32) {
        _mm512_stream_ps(reinterpret_cast<float*>(row) + 16 * v, lo);
        _mm512_stream_ps(reinterpret_cast<float*>(row) + 16 * v + 16, hi);
      } else {
        _mm512_stream_si512(reinterpret_cast<__m512i*>(row) + v / 2, round_to_bf16_words(lo, hi));
      }
    }
  }
}

// Steps ahead of the FMA kernels' B loads that their lines are prefetched into L1. The driver
// sweeps each A panel (in L1) across the block's B panels, which come from L2, a step's
// 16 * kNv floats at a time; the prefetches go on into the next B panel, which the sweep reads
// next (a prefetch past the last panel's end does not fault). 6 x 64 kernel, 128 steps, 1 thread
// on a Sapphire Rapids-class VM: 256 KiB of B panels 143-146 -> 158-162 GFLOP/s (4, 8 and 16
// steps within 3% of each other), one 32 KiB panel (in L1) 177-180 -> 171-173; compute-bound fp32
// forward, 1024 x 4096 x 4096, medians of 5: 1 thread 230-239 -> 222-231 ms, 2 threads
// 115.6-118.0 -> 110.4-113.4 ms in one run and within the noise in another, as were gmm_bench's
// fp32 cells (0.97x to 1.04x).
constexpr std::int64_t kFmaPrefetchSteps = 8;

// Contraction loop of the fp32 FMA kernels: kMr x (16 * kNv) accumulators; per step one
// broadcast of A per row (lane-major A panel), kNv loads of B (and kNv prefetches of the B lines
// kFmaPrefetchSteps on).
template <int kMr, int kNv>
GMM_TARGET_AVX512 __attribute__((always_inline)) inline void fma_steps_avx512(
    std::int64_t steps, const float* a, const float* b, __m512 (&acc)[kMr][kNv]) {
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  for (std::int64_t s = 0; s < steps; ++s, ++a, b += 16 * kNv) {
    __m512 bv[kNv];
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) {
      _mm_prefetch(reinterpret_cast<const char*>(b + 16 * (kNv * kFmaPrefetchSteps + v)),
                   _MM_HINT_T0);
    }
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) bv[v] = _mm512_loadu_ps(b + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) {
      const __m512 av = _mm512_set1_ps(a[i * steps]);
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
    }
  }
}

// Contraction loop of the vdpbf16ps kernels: kMr x (16 * kNv) fp32 accumulators; per step (a
// pair of contraction indices) one 32-bit broadcast of A's bf16 pair per row and kNv loads of
// B's pairs. Products of bf16 values are exact in fp32; the instruction treats bf16 subnormals as
// zero.
template <int kMr, int kNv>
GMM_TARGET_AVX512BF16 __attribute__((always_inline)) inline void dot_steps_avx512_bf16(
    std::int64_t steps, const std::uint16_t* a, const std::uint16_t* b, __m512 (&acc)[kMr][kNv]) {
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  for (std::int64_t s = 0; s < steps; ++s, a += 2, b += 32 * kNv) {
    __m512i bv[kNv];
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) bv[v] = _mm512_loadu_si512(b + 32 * v);
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) {
      std::int32_t pair;
      std::memcpy(&pair, a + 2 * i * steps, sizeof pair);
      const __m512i av = _mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) {
        acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)av, (__m512bh)bv[v]);
      }
    }
  }
}

// MicroKernelFn of the AVX-512F kit: fp32 FMA steps, epilogue into the fp32 tile of C.
template <int kMr, int kNv>
GMM_TARGET_AVX512 void kernel_avx512_f32(std::int64_t steps, const void* a_packed,
                                         const void* b_packed, float* c, std::int64_t ldc,
                                         const float* row_scales, const float* col_scales,
                                         bool first, int rows) {
  prefetch_c_rows<kNv>(c, ldc, rows, first);
  __m512 acc[kMr][kNv];
  fma_steps_avx512<kMr, kNv>(steps, static_cast<const float*>(a_packed),
                             static_cast<const float*>(b_packed), acc);
  store_tile_avx512<kMr, kNv>(c, ldc, acc, row_scales, col_scales, first, rows);
}

// MicroKernelFn of the AVX512_BF16 kit: vdpbf16ps steps, epilogue into the fp32 tile of C.
template <int kMr, int kNv>
GMM_TARGET_AVX512BF16 void kernel_avx512_bf16(std::int64_t steps, const void* a_packed,
                                              const void* b_packed, float* c, std::int64_t ldc,
                                              const float* row_scales, const float* col_scales,
                                              bool first, int rows) {
  prefetch_c_rows<kNv>(c, ldc, rows, first);
  __m512 acc[kMr][kNv];
  dot_steps_avx512_bf16<kMr, kNv>(steps, static_cast<const std::uint16_t*>(a_packed),
                                  static_cast<const std::uint16_t*>(b_packed), acc);
  store_tile_avx512<kMr, kNv>(c, ldc, acc, row_scales, col_scales, first, rows);
}

// OutputKernelFn of the AVX-512F kit: fp32 FMA steps, rows written past the caches.
template <int kMr, int kNv>
GMM_TARGET_AVX512 void output_kernel_avx512_f32(std::int64_t steps, const void* a_packed,
                                                const void* b_packed, std::size_t b_panel_bytes,
                                                std::int64_t tiles, void* out,
                                                std::int64_t out_row_stride, DType dtype,
                                                const float* row_scales, const float* col_scales,
                                                int rows) {
  const std::size_t tile_bytes = 16 * kNv * size_of(dtype);
  for (std::int64_t t = 0; t < tiles; ++t) {
    __m512 acc[kMr][kNv];
    fma_steps_avx512<kMr, kNv>(steps, static_cast<const float*>(a_packed),
                               reinterpret_cast<const float*>(
                                   static_cast<const unsigned char*>(b_packed) + t * b_panel_bytes),
                               acc);
    stream_out_tile_avx512<kMr, kNv>(static_cast<unsigned char*>(out) + t * tile_bytes,
                                     out_row_stride, dtype, acc, row_scales,
                                     col_scales + 16 * kNv * t, rows);
  }
}

// One pair of vectors of a row of an output kernel's tile (lo's first), stored past the caches:
// f32 as two cache lines, bf16 as one, rounded by vcvtne2ps2bf16 (round_to_bf16_words_bf16).
GMM_TARGET_AVX512BF16 inline void stream_out_pair_avx512bf16(void* dst, DType dtype, __m512 lo,
                                                             __m512 hi) {
  if (dtype == DType::f32) {
    _mm512_stream_ps(static_cast<float*>(dst), lo);
    _mm512_stream_ps(static_cast<float*>(dst) + 16, hi);
  } else {
    _mm512_stream_si512(static_cast<__m512i*>(dst), round_to_bf16_words_bf16(lo, hi));
  }
}

// OutputKernelFn of the AVX512_BF16 kit: vdpbf16ps steps, rows written past the caches (bf16
// rounded by vcvtne2ps2bf16, a cache line per pair of vectors).
template <int kMr, int kNv>
GMM_TARGET_AVX512BF16 void output_kernel_avx512_bf16(std::int64_t steps, const void* a_packed,
                                                     const void* b_packed,
                                                     std::size_t b_panel_bytes, std::int64_t tiles,
                                                     void* out, std::int64_t out_row_stride,
                                                     DType dtype, const float* row_scales,
                                                     const float* col_scales, int rows) {
  static_assert(kNv % 2 == 0, "bf16 rows are stored a cache line (two vectors) at a time");
  const std::int64_t row_bytes = out_row_stride * static_cast<std::int64_t>(size_of(dtype));
  const std::size_t tile_bytes = 16 * kNv * size_of(dtype);
  for (std::int64_t t = 0; t < tiles; ++t) {
    __m512 acc[kMr][kNv];
    dot_steps_avx512_bf16<kMr, kNv>(
        steps, static_cast<const std::uint16_t*>(a_packed),
        reinterpret_cast<const std::uint16_t*>(static_cast<const unsigned char*>(b_packed) +
                                               t * b_panel_bytes),
        acc);
    unsigned char* tile_out = static_cast<unsigned char*>(out) + t * tile_bytes;
    if (dtype == DType::f32) {
      stream_out_tile_avx512<kMr, kNv>(tile_out, out_row_stride, dtype, acc, row_scales,
                                       col_scales + 16 * kNv * t, rows);
      continue;
    }
    __m512 cs[kNv];
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) cs[v] = _mm512_loadu_ps(col_scales + 16 * (kNv * t + v));
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) {
      if (i >= rows) break;
      const __m512 rs = _mm512_set1_ps(row_scales[i]);
#pragma GCC unroll 4
      for (int v = 0; v < kNv; v += 2) {
        __m512 lo, hi;
        scaled_pair<kNv>(acc[i], rs, cs, v, lo, hi);
        stream_out_pair_avx512bf16(tile_out + i * row_bytes + 64 * (v / 2), dtype, lo, hi);
      }
    }
  }
}

// KernelKit::pack_b of the AVX-512F kit and of the bf16-pair kits, defined in
// kernels/fp8_avx512.hpp, and
// KernelKit::stream of the two kits below, defined in kernels/stream_avx512.hpp (both included
// at the end of this header).
inline void pack_b_f32(const PanelSource& src, int width, std::int64_t lane0, std::int64_t lanes,
                       std::int64_t k0, std::int64_t kc, const float* lane_scales, void* out);
template <int kStepMultiple>
void pack_b_bf16_pairs(const PanelSource& src, int width, std::int64_t lane0, std::int64_t lanes,
                       std::int64_t k0, std::int64_t kc, const float* lane_scales, void* out);
inline void stream_avx512_f32(const PanelSource& b, std::int64_t n0, std::int64_t n1,
                              const StreamChunk* chunks, std::int64_t count, int rows, float* c,
                              std::int64_t ldc, bool first);
inline void stream_avx512_bf16(const PanelSource& b, std::int64_t n0, std::int64_t n1,
                               const StreamChunk* chunks, std::int64_t count, int rows, float* c,
                               std::int64_t ldc, bool first);
inline int stream_rows_avx512_bf16(const PanelSource& b);
inline std::int64_t strip_scratch_bytes();

// The AVX-512F path: fp32 values (bf16 / fp8 / int8 widened exactly) and a 6 x 64 FMA kernel
// (four B vectors per step: in the driver's loops it ran 5% faster than 12 x 32, and 64 divides the
// N of every benchmark shape). Tasks of 512 rows (516, whole panels) rather than 384: 1024 rows
// make two tasks that two workers share whole (see split_tasks), and each B block is packed for
// fewer rows; compute-bound fp32, 2 threads, ms: fwd 166-167 -> 161, dlhs 161 -> 157-158, drhs
// 170 -> 166, the shapes of at most 384 rows per group level. Transposed weights in chunks of up
// to 1024 (runs_chunk; see amx_kit), fp32 dlhs, 2 threads, ms, against 512: dsv3-down 70.1 ->
// 63.5, dsv3-up 67.0 -> 60.5, the others level (2048: no more).
inline KernelKit avx512f_kit() {
  KernelKit kit;
  kit.isa = Isa::avx512f;
  kit.format = {PackedElement::f32, 6, 64, 1};
  kit.pack_a = pack_avx512<PackedElement::f32, PanelOrder::lane_major>;
  kit.pack_b = pack_b_f32;
  kit.kernel = kernel_avx512_f32<6, 4>;
  kit.few_rows_kernel = kernel_avx512_f32<4, 4>;
  kit.few_rows = 4;
  kit.output_kernel = output_kernel_avx512_f32<6, 4>;
  kit.stream = stream_avx512_f32;
  kit.stream_rows = four_stream_rows;
  kit.absmax = absmax_avx512;
  kit.store_row = store_row_avx512_out;
  kit.store_fence = store_fence_x86;
  kit.tiles = {512, 128, 512};
  kit.runs_chunk = 1024;
  return kit;
}

// The AVX512_BF16 path for operands exact in bf16: bf16 pairs and an 8 x 32 vdpbf16ps kernel.
inline KernelKit avx512bf16_kit() {
  KernelKit kit;
  kit.isa = Isa::avx512bf16;
  kit.format = {PackedElement::bf16, 8, 32, 2};
  kit.pack_a = pack_avx512<PackedElement::bf16, PanelOrder::lane_major>;
  kit.pack_b = pack_b_bf16_pairs<1>;
  kit.kernel = kernel_avx512_bf16<8, 2>;
  kit.few_rows_kernel = kernel_avx512_bf16<4, 2>;
  kit.few_rows = 4;
  kit.output_kernel = output_kernel_avx512_bf16<8, 2>;
  kit.stream = stream_avx512_bf16;
  kit.stream_rows = stream_rows_avx512_bf16;
  kit.stream_scratch_bytes = strip_scratch_bytes();
  kit.absmax = absmax_avx512;
  kit.store_row = store_row_avx512bf16_out;
  kit.store_fence = store_fence_x86;
  kit.tiles = {512, 512, 512};
  kit.runs_chunk = 1024;
  return kit;
}

}  // namespace gmm::kernels

GMM_KERNELS_RESTORE_WARNINGS

#include "gmm/kernels/fp8_avx512.hpp"
#include "gmm/kernels/stream_avx512.hpp"
#endif
