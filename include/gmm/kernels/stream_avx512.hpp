// Streaming kernels of the AVX-512 paths (KernelKit::stream): a few rows of C straight from
// unpacked B, widened on the fly to bf16 pairs (vdpbf16ps) or fp32 (FMA).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "gmm/kernels/avx512.hpp"
#include "gmm/kernels/cpu.hpp"
#include "gmm/kernels/format.hpp"
#include "gmm/kernels/fp8_avx512.hpp"
#include "gmm/kernels/reference.hpp"

#if GMM_KERNELS_X86
GMM_KERNELS_SILENCE_UNDEFINED_WARNINGS

namespace gmm::kernels {

// Two layouts of B reach a streaming kernel. With contiguous lanes ([K, N] weights, forward)
// the chunk's contraction rows are read one after the other across a span of columns, each
// contraction index (pair for bf16) added to the span's sums in order, so each column is summed
// exactly as the packed micro-kernel sums it: the results are bit-identical to the packed path
// over the same chunk. With contiguous contraction runs (transposed weights, dlhs) each column's
// run is read as vectors along the contraction and dotted with A's rows, 16 partial sums per column
// added up at the end of the chunk: the same products, summed in another order.

// The lanes-contiguous kernels read a span of up to kStreamSpan columns band by band: a band is
// kStreamBand contraction pairs, walked by blocks of columns whose sums stay in registers
// (the span's sums wait in memory between bands) while the next band's rows are prefetched
// whole (each row is a new page of the weights, which the hardware prefetchers do not follow).
constexpr std::int64_t kStreamSpan = 4096;
constexpr std::int64_t kStreamBand = 8;

// Exact fp32 values of 16 lanes of B from element `index` on, contiguous or strided.
template <DType kDtype>
GMM_TARGET_AVX512 inline __m512 load16_lanes(const PanelSource& b, std::int64_t index,
                                             __mmask16 mask) {
  return b.lane_stride == 1 ? load16<kDtype>(b.data, index, mask)
                            : load16_strided<kDtype>(b.data, index, b.lane_stride, mask);
}

// bf16 pairs of 16 columns from two contraction rows (the second zero when absent), any dtype:
// exact fp32 values, truncated to their (exact) bf16 halves.
template <DType kDtype>
GMM_TARGET_AVX512 inline __m512i lane_pairs(const PanelSource& b, std::int64_t index,
                                            __mmask16 mask, bool second) {
  return to_bf16_pairs(load16_lanes<kDtype>(b, index, mask),
                       load16_lanes<kDtype>(b, index + b.k_stride, second ? mask : 0));
}

// 16 pairs (32 contraction indices in order) of one column's run, any dtype.
template <DType kDtype>
GMM_TARGET_AVX512 inline __m512i run_pairs(const void* data, std::int64_t index,
                                           std::int64_t count) {
  if constexpr (kDtype == DType::bf16) {
    return _mm512_maskz_loadu_epi16(first_words(count),
                                    static_cast<const std::uint16_t*>(data) + index);
  } else {
    const __m256i low = to_bf16_words(load16<kDtype>(data, index, first_lanes(count)));
    const __m256i high = to_bf16_words(load16<kDtype>(data, index + 16, first_lanes(count - 16)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
  }
}

// Bytes of a page: the hardware prefetchers follow accesses within one page.
constexpr std::int64_t kPageBytes = 4096;

// Prefetches (into L2) the lines of rows [row0, row1) of a lanes-contiguous B over columns
// [n, n + cols), whole row after whole row, a part at a time: the next band's rows, spread over
// the blocks (or strips) of the current band, so that the memory sees each row's run in order
// whatever order the kernel then reads it in (each row is a new page of the weights, which the
// hardware prefetchers do not follow). No-op for B with strided lanes, and on CPUs where the
// hardware prefetchers do better (CpuFeatures::row_prefetch) unless B's rows are shorter than a
// page: a band then walks each page back and forth, a block of columns of each of its rows at a
// time, and Intel's prefetchers lose it (64 experts of one row, 2048 x 1408 fp8 weights each,
// 2 threads on Sapphire Rapids: 20.2-20.7 ms without, 9.7 with; rows of a page ran 1.5x slower
// with).
class RowPrefetcher {
 public:
  RowPrefetcher(const PanelSource& b, std::int64_t row0, std::int64_t row1, std::int64_t n,
                std::int64_t cols, std::int64_t element, std::int64_t parts)
      : row_(static_cast<const char*>(b.data) + (row0 * b.k_stride + n) * element),
        row_bytes_(cols * element),
        stride_(b.k_stride * element),
        rows_left_(b.lane_stride == 1 && (cpu_features().row_prefetch || stride_ < kPageBytes)
                       ? row1 - row0
                       : 0) {
    const std::int64_t lines = rows_left_ * ((row_bytes_ + 63) / 64);
    per_part_ = (lines + parts - 1) / std::max<std::int64_t>(1, parts);
  }

  // Prefetches the next part's lines.
  void next_part() {
    for (std::int64_t line = 0; line < per_part_ && rows_left_ > 0; ++line) {
      prefetch_line_l2(row_ + offset_);
      offset_ += 64;
      if (offset_ >= row_bytes_) {
        offset_ = 0;
        row_ += stride_;
        --rows_left_;
      }
    }
  }

 private:
  const char* row_;
  std::int64_t row_bytes_, stride_, rows_left_, offset_ = 0, per_part_ = 0;
};

// The epilogue of one row of a span: c (= or +=) acc * row_scale * col_scales over `cols`
// columns.
GMM_TARGET_AVX512 inline void stream_store_span(float* c, const float* acc, float row_scale,
                                                const float* col_scales, std::int64_t cols,
                                                bool first) {
  const __m512 rs = _mm512_set1_ps(row_scale);
  for (std::int64_t j = 0; j < cols; j += 16) {
    const __mmask16 mask = first_lanes(cols - j);
    const __m512 scaled = _mm512_mul_ps(_mm512_mul_ps(_mm512_load_ps(acc + j), rs),
                                        _mm512_maskz_loadu_ps(mask, col_scales + j));
    _mm512_mask_storeu_ps(
        c + j, mask, first ? scaled : _mm512_add_ps(_mm512_maskz_loadu_ps(mask, c + j), scaled));
  }
}

// stream_store_span for sums kept in widen_fp8_lanes' order: each 64 columns' four vectors are
// put back in column order (a 4 x 4 transpose of 128-bit lanes) first.
GMM_TARGET_AVX512 inline void stream_store_span_fp8(float* c, const float* sums, float row_scale,
                                                    const float* col_scales, std::int64_t cols,
                                                    bool first) {
  alignas(64) float ordered[64];
  for (std::int64_t j = 0; j < cols; j += 64) {
    const __m512 q0 = _mm512_load_ps(sums + j), q1 = _mm512_load_ps(sums + j + 16);
    const __m512 q2 = _mm512_load_ps(sums + j + 32), q3 = _mm512_load_ps(sums + j + 48);
    const __m512 t0 = _mm512_shuffle_f32x4(q0, q1, 0x44), t1 = _mm512_shuffle_f32x4(q0, q1, 0xEE);
    const __m512 t2 = _mm512_shuffle_f32x4(q2, q3, 0x44), t3 = _mm512_shuffle_f32x4(q2, q3, 0xEE);
    _mm512_store_ps(ordered, _mm512_shuffle_f32x4(t0, t2, 0x88));
    _mm512_store_ps(ordered + 16, _mm512_shuffle_f32x4(t0, t2, 0xDD));
    _mm512_store_ps(ordered + 32, _mm512_shuffle_f32x4(t1, t3, 0x88));
    _mm512_store_ps(ordered + 48, _mm512_shuffle_f32x4(t1, t3, 0xDD));
    stream_store_span(c + j, ordered, row_scale, col_scales + j,
                      std::min<std::int64_t>(64, cols - j), first);
  }
}

// The epilogue of a runs kernel: each accumulator's 16 partial sums added up, then scaled.
template <int kRows, int kCols>
GMM_TARGET_AVX512 inline void stream_store_sums(float* c, std::int64_t ldc,
                                                const __m512 (&acc)[kRows][kCols],
                                                const float* row_scales, const float* col_scales,
                                                std::int64_t cols, bool first) {
  for (int i = 0; i < kRows; ++i) {
    for (int j = 0; j < kCols && j < cols; ++j) {
      store_tile_element(c + i * ldc + j, _mm512_reduce_add_ps(acc[i][j]), row_scales[i],
                         col_scales[j], first);
    }
  }
}

// Zeroes a block of accumulators.
template <int kRows, int kCols>
GMM_TARGET_AVX512 inline void zero_sums(__m512 (&sums)[kRows][kCols]) {
#pragma GCC unroll 4
  for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < kCols; ++j) sums[i][j] = _mm512_setzero_ps();
  }
}

// The epilogue of a runs kernel after chunk s of `count` (see StreamFn): a single chunk's sums
// are stored by stream_store_sums; with several (B's scale segments), each chunk's sums are scaled
// into `totals` in registers, so that each column's run is read in one pass across the segments
// (the chunks of one call, not a call per chunk: three times as fast on Ice Lake's fp8-block
// decode dlhs), and the totals are added up and stored after the last chunk.
template <int kRows, int kCols>
GMM_TARGET_AVX512 inline void stream_finish_chunk(float* c, std::int64_t ldc,
                                                  __m512 (&totals)[kRows][kCols],
                                                  const __m512 (&acc)[kRows][kCols],
                                                  const StreamChunk& chunk, std::int64_t s,
                                                  std::int64_t count, std::int64_t col0,
                                                  std::int64_t cols, bool first) {
  const float* col_scales = chunk.col_scales + col0;
  if (count == 1) {
    return stream_store_sums<kRows, kCols>(c, ldc, acc, chunk.row_scales, col_scales, cols, first);
  }
#pragma GCC unroll 4
  for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < kCols; ++j) {
      const float scale = j < cols ? chunk.row_scales[i] * col_scales[j] : 0.0f;
      totals[i][j] = _mm512_fmadd_ps(acc[i][j], _mm512_set1_ps(scale), totals[i][j]);
    }
  }
  if (s + 1 < count) return;
  for (int i = 0; i < kRows; ++i) {
    for (int j = 0; j < kCols && j < cols; ++j) {
      const float sum = _mm512_reduce_add_ps(totals[i][j]);
      c[i * ldc + j] = first ? sum : c[i * ldc + j] + sum;
    }
  }
}

// ---- vdpbf16ps kernels (the AVX512_BF16 kit) -------------------------------------------------

// Lanes-contiguous B (see kStreamBand): blocks of 16 * kNv columns, one vector of bf16 pairs per
// 16 columns and contraction pair, widened from any dtype.
template <DType kDtype, int kRows, int kNv>
GMM_TARGET_AVX512BF16 void stream_bf16_lanes(const PanelSource& b, std::int64_t n0, std::int64_t n1,
                                             std::int64_t k0, std::int64_t kc,
                                             const std::uint16_t* a, std::int64_t a_stride,
                                             float* c, std::int64_t ldc, const float* row_scales,
                                             const float* col_scales, bool first) {
  constexpr std::int64_t kBlock = 16 * kNv;
  alignas(64) float sums[kRows][kStreamSpan];
  const std::int64_t pairs = (kc + 1) / 2, element = static_cast<std::int64_t>(size_of(kDtype));
  for (std::int64_t n = n0; n < n1; n += kStreamSpan) {
    const std::int64_t cols = std::min(kStreamSpan, n1 - n);
    const std::int64_t blocks = (cols + kBlock - 1) / kBlock;
    for (int i = 0; i < kRows; ++i) std::fill(sums[i], sums[i] + blocks * kBlock, 0.0f);
    for (std::int64_t p0 = 0; p0 < pairs; p0 += kStreamBand) {
      const std::int64_t p1 = std::min(pairs, p0 + kStreamBand);
      RowPrefetcher next_band(b, k0 + 2 * (p0 + kStreamBand), k0 + 2 * (p1 + kStreamBand), n, cols,
                              element, blocks);
      for (std::int64_t block = 0; block < blocks; ++block) {
        const std::int64_t j = block * kBlock;
        next_band.next_part();
        __m512 acc[kRows][kNv];
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 8
          for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_load_ps(sums[i] + j + 16 * v);
        }
        for (std::int64_t s = p0; s < p1; ++s) {
          const std::int64_t index = (k0 + 2 * s) * b.k_stride + (n + j) * b.lane_stride;
          __m512i bv[kNv];
#pragma GCC unroll 8
          for (int v = 0; v < kNv; ++v) {
            bv[v] = lane_pairs<kDtype>(b, index + 16 * v * b.lane_stride,
                                       first_lanes(cols - j - 16 * v), 2 * s + 1 < kc);
          }
#pragma GCC unroll 4
          for (int i = 0; i < kRows; ++i) {
            std::int32_t pair;
            std::memcpy(&pair, a + i * a_stride + 2 * s, sizeof pair);
            const __m512i av = _mm512_set1_epi32(pair);
#pragma GCC unroll 8
            for (int v = 0; v < kNv; ++v) {
              acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)av, (__m512bh)bv[v]);
            }
          }
        }
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 8
          for (int v = 0; v < kNv; ++v) _mm512_store_ps(sums[i] + j + 16 * v, acc[i][v]);
        }
      }
    }
    for (int i = 0; i < kRows; ++i) {
      stream_store_span(c + i * ldc + (n - n0), sums[i], row_scales[i], col_scales + (n - n0), cols,
                        first);
    }
  }
}

// Lanes-contiguous fp8 B with contiguous columns (see kStreamBand): blocks of 16 * kNv columns
// (kNv a multiple of 4), 64 columns of two contraction rows widened at a time by
// widen_fp8_lanes (the sums are kept in its column order).
template <DType kFp8, int kRows, int kNv>
GMM_TARGET_AVX512VBMI void stream_bf16_lanes_fp8(const PanelSource& b, std::int64_t n0,
                                                 std::int64_t n1, std::int64_t k0, std::int64_t kc,
                                                 const std::uint16_t* a, std::int64_t a_stride,
                                                 float* c, std::int64_t ldc,
                                                 const float* row_scales, const float* col_scales,
                                                 bool first) {
  constexpr std::int64_t kBlock = 16 * kNv;
  alignas(64) float sums[kRows][kStreamSpan];
  const Fp8Widener widener = fp8_widener<kFp8>();
  const auto* data = static_cast<const std::uint8_t*>(b.data);
  const std::int64_t pairs = (kc + 1) / 2;
  for (std::int64_t n = n0; n < n1; n += kStreamSpan) {
    const std::int64_t cols = std::min(kStreamSpan, n1 - n);
    const std::int64_t blocks = (cols + kBlock - 1) / kBlock;
    for (int i = 0; i < kRows; ++i) std::fill(sums[i], sums[i] + blocks * kBlock, 0.0f);
    for (std::int64_t p0 = 0; p0 < pairs; p0 += kStreamBand) {
      const std::int64_t p1 = std::min(pairs, p0 + kStreamBand);
      RowPrefetcher next_band(b, k0 + 2 * (p0 + kStreamBand), k0 + 2 * (p1 + kStreamBand), n, cols,
                              1, blocks);
      for (std::int64_t block = 0; block < blocks; ++block) {
        const std::int64_t j = block * kBlock;
        next_band.next_part();
        __m512 acc[kRows][kNv];
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 8
          for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_load_ps(sums[i] + j + 16 * v);
        }
        for (std::int64_t s = p0; s < p1; ++s) {
          const std::uint8_t* row = data + (k0 + 2 * s) * b.k_stride + n + j;
          const bool second = 2 * s + 1 < kc;
          std::int32_t a_pairs[kRows];
#pragma GCC unroll 4
          for (int i = 0; i < kRows; ++i) std::memcpy(&a_pairs[i], a + i * a_stride + 2 * s, 4);
#pragma GCC unroll 2
          for (int u = 0; u < kNv / 4; ++u) {
            const __mmask64 mask = first_bytes(cols - j - 64 * u);
            __m512i bv[4];
            widen_fp8_lanes(_mm512_maskz_loadu_epi8(mask, row + 64 * u),
                            _mm512_maskz_loadu_epi8(second ? mask : 0, row + b.k_stride + 64 * u),
                            widener, bv);
#pragma GCC unroll 4
            for (int i = 0; i < kRows; ++i) {
              const __m512i av = _mm512_set1_epi32(a_pairs[i]);
#pragma GCC unroll 4
              for (int v = 0; v < 4; ++v) {
                acc[i][4 * u + v] =
                    _mm512_dpbf16_ps(acc[i][4 * u + v], (__m512bh)av, (__m512bh)bv[v]);
              }
            }
          }
        }
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 8
          for (int v = 0; v < kNv; ++v) _mm512_store_ps(sums[i] + j + 16 * v, acc[i][v]);
        }
      }
    }
    for (int i = 0; i < kRows; ++i) {
      stream_store_span_fp8(c + i * ldc + (n - n0), sums[i], row_scales[i], col_scales + (n - n0),
                            cols, first);
    }
  }
}

// The strip kernel: up to kStripRows rows over lanes-contiguous fp8 or bf16 B (groups of a dozen
// tokens, as in DeepSeek-V3's routed experts), where packing B would cost as much as the product.
// A span of up to kStripSpan columns is read band by band (kStripBand contraction pairs, the next
// band's rows prefetched whole); each band is walked by one block of all the rows (up to
// kStripBlock) or two of about half, each block in strips of 16 columns whose sums stay in
// registers: every widened vector of B pairs serves all the block's rows, so the widening's
// shuffles hide behind the dot products, and a second block finds the band in cache. A group of
// 17 to 24 rows (DeepSeek-V3's groups average 16) is one block, not 16 and 8 (25-33% faster over
// multinomial groups, 2 threads, scratch), and a block computes exactly its rows: each width has
// its own band function (blocks padded to a multiple of 4 rows computed 10% more rows over
// DeepSeek-V3's multinomial groups and ran its fp8 forward 5% slower, 2 threads). Each column is
// summed pair by pair in order, as the packed micro-kernel sums it. A strip loads and stores its
// rows' sums once per band: long bands (64 pairs: 128 KiB of an fp8 span, 256 KiB of a bf16 one, in
// L2 with the next band) and wide spans (1024 columns, whole rows of DeepSeek-V3's up projection)
// ran its 8- to 32-row fp8 groups 8-17% faster than 16-pair bands over 512 columns (one thread,
// scratch).
constexpr int kStripRows = 32;
constexpr int kStripBlock = 24;
constexpr int kStripMinBlock = 5;  // fewer rows take the four-row streaming kernels
constexpr std::int64_t kStripSpan = 1024;
constexpr std::int64_t kStripBand = 64;

// The bf16 pairs of 16 columns at `at` (live lanes) of contraction rows r .. r + 3 (rows past
// the chunk read as zeros, `present` of them read): rows r, r + 1 (pairs[0]), then r + 2, r + 3.
template <DType kDtype>
GMM_TARGET_AVX512VBMI inline void strip_quad_pairs(const unsigned char* at, std::int64_t row_bytes,
                                                   __mmask16 live, int present, __m512i zip,
                                                   const Fp8Widener& widener, __m512i (&pairs)[2]) {
  if constexpr (PairSource<kDtype>::fp8) {
    __m512i codes;
    if (live == 0xFFFF && present == 4) {  // four 16-byte loads broadcast into their lanes
      codes = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
      for (int r = 1; r < 4; ++r) {
        codes = _mm512_mask_broadcast_i32x4(
            codes, static_cast<__mmask16>(0xF << (4 * r)),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(at + r * row_bytes)));
      }
    } else {
      codes = _mm512_setzero_si512();
      for (int r = 0; r < present; ++r) {
        codes = _mm512_mask_broadcast_i32x4(codes, static_cast<__mmask16>(0xF << (4 * r)),
                                            _mm_maskz_loadu_epi8(live, at + r * row_bytes));
      }
    }
    lookup_bf16(_mm512_permutexvar_epi8(zip, codes), widener, pairs[0], pairs[1]);
  } else {
    const __mmask16 none = 0;
    for (int h = 0; h < 2; ++h) {
      const unsigned char* x = at + 2 * h * row_bytes;
      const __m256i xs = _mm256_maskz_loadu_epi16(2 * h < present ? live : none, x);
      const __m256i ys = _mm256_maskz_loadu_epi16(2 * h + 1 < present ? live : none, x + row_bytes);
      pairs[h] =
          _mm512_permutex2var_epi16(_mm512_castsi256_si512(xs), zip, _mm512_castsi256_si512(ys));
    }
  }
}

// The span's sums of the strip kernel: row i at i * kStripSumsStride floats, rows a line more
// than 4 KiB apart (so that a strip's rows do not share an L1 set).
constexpr std::int64_t kStripSumsStride = kStripSpan + 16;

// Floats of the strip kernel's per-thread sums: kStripRows rows and a line of alignment slack.
constexpr std::size_t kStripSumsFloats =
    kStripRows * kStripSumsStride + kCacheLineBytes / sizeof(float);

// KernelKit::stream_scratch_bytes of the AVX512_BF16 kit: the strip kernel's sums.
inline std::int64_t strip_scratch_bytes() {
  return static_cast<std::int64_t>(kStripSumsFloats * sizeof(float));
}

// The calling thread's span sums of the strip kernel, kStripRows rows, 64-byte aligned: on the
// heap, once per thread (130 KiB is more than some threads' whole stack).
inline float* strip_sums() {
  thread_local std::vector<float> buffer(kStripSumsFloats);
  const std::size_t line = kCacheLineBytes;
  const std::size_t misaligned = reinterpret_cast<std::uintptr_t>(buffer.data()) % line;
  return buffer.data() + (misaligned == 0 ? 0 : (line - misaligned) / sizeof(float));
}

// What one band of the strip kernel works on: B's first line of the band, its rows, the A pairs
// of one block copied step-major (a_pairs[s * kRows + i]: row i of the block, pair s of the band)
// and the block's sums.
struct StripBand {
  const unsigned char* b = nullptr;
  std::int64_t row_bytes = 0, rows_left = 0, pairs = 0, cols = 0;
  const std::int32_t* a_pairs = nullptr;
  float* sums = nullptr;
  bool first = false;  // the span's first band: the sums start at zero
};

// One band for a block of kRows rows, strip by strip, each strip prefetching a part of the next
// band.
template <DType kDtype, int kRows>
GMM_TARGET_AVX512VBMI void strip_band(const StripBand& band, RowPrefetcher& next_band) {
  static const Fp8QuadZip fp8_zip;
  static const Bf16PairZip bf16_zip;
  Fp8Widener widener{};
  __m512i zip;
  if constexpr (PairSource<kDtype>::fp8) {
    widener = fp8_widener<kDtype>();
    zip = _mm512_load_si512(fp8_zip.order);
  } else {
    zip = _mm512_load_si512(bf16_zip.first);
  }
  constexpr std::int64_t kElement = PairSource<kDtype>::bytes;
  const unsigned char* const b = band.b;
  const std::int64_t row_bytes = band.row_bytes, rows_left = band.rows_left, pairs = band.pairs;
  const std::int64_t cols = band.cols, strips = (cols + 15) / 16;
  const std::int32_t* const a_pairs = band.a_pairs;
  float* const sums = band.sums;
  const bool first = band.first;
  for (std::int64_t strip = 0; strip < strips; ++strip) {
    const std::int64_t j = 16 * strip;
    next_band.next_part();
    const __mmask16 live = first_lanes(cols - j);
    __m512 acc[kRows];
#pragma GCC unroll 24
    for (int i = 0; i < kRows; ++i) {
      acc[i] = first ? _mm512_setzero_ps() : _mm512_load_ps(sums + i * kStripSumsStride + j);
    }
    // each quad's pairs are widened before the previous quad's products: the loads and shuffles
    // wait on nothing, so they run under the products whatever order the compiler's tuning picks
    // (-mtune=znver3, which GCC 12's -march=native picks on Zen 4, put them after: 20% slower)
    const unsigned char* quad = b + j * kElement;
    __m512i next[2];
    strip_quad_pairs<kDtype>(quad, row_bytes, live,
                             static_cast<int>(std::min<std::int64_t>(4, rows_left)), zip, widener,
                             next);
    for (std::int64_t s = 0; s < pairs; s += 2) {
      const __m512i bv[2] = {next[0], next[1]};
      if (s + 2 < pairs) {
        quad += 4 * row_bytes;
        strip_quad_pairs<kDtype>(quad, row_bytes, live,
                                 static_cast<int>(std::min<std::int64_t>(4, rows_left - 2 * s - 4)),
                                 zip, widener, next);
      }
      const std::int32_t* a = a_pairs + s * kRows;
#pragma GCC unroll 24
      for (int i = 0; i < kRows; ++i) {
        acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)bv[0], (__m512bh)_mm512_set1_epi32(a[i]));
      }
      if (s + 1 == pairs) break;
#pragma GCC unroll 24
      for (int i = 0; i < kRows; ++i) {
        acc[i] =
            _mm512_dpbf16_ps(acc[i], (__m512bh)bv[1], (__m512bh)_mm512_set1_epi32(a[kRows + i]));
      }
    }
#pragma GCC unroll 24
    for (int i = 0; i < kRows; ++i) {
      _mm512_store_ps(sums + i * kStripSumsStride + j, acc[i]);
    }
  }
}

// The band functions of blocks of kStripMinBlock + kOffsets rows, by offset.
template <DType kDtype, int... kOffsets>
constexpr std::array<void (*)(const StripBand&, RowPrefetcher&), sizeof...(kOffsets)> strip_bands(
    std::integer_sequence<int, kOffsets...>) {
  return {strip_band<kDtype, kStripMinBlock + kOffsets>...};
}

// KernelKit::stream for kStripMinBlock to kStripRows rows of lanes-contiguous fp8 or bf16 B:
// spans, bands and blocks of rows (each block's band function picked by its row count).
template <DType kDtype>
GMM_TARGET_AVX512VBMI void stream_bf16_strips(const PanelSource& b, std::int64_t n0,
                                              std::int64_t n1, std::int64_t k0, std::int64_t kc,
                                              const std::uint16_t* a, std::int64_t a_stride,
                                              int rows, float* c, std::int64_t ldc,
                                              const float* row_scales, const float* col_scales,
                                              bool first) {
  constexpr std::int64_t kElement = PairSource<kDtype>::bytes;
  float* const sums = strip_sums();
  alignas(64) std::int32_t a_pairs[kStripBand * kStripBlock];
  const auto* data = static_cast<const unsigned char*>(b.data);
  const std::int64_t pairs = (kc + 1) / 2;
  constexpr auto band_of_width =
      strip_bands<kDtype>(std::make_integer_sequence<int, kStripBlock - kStripMinBlock + 1>());
  static_assert((kStripRows + 1) / 2 <= kStripBlock, "a band function for every block width");
  // one block of all the rows, or two of about half of them
  const int block = rows <= kStripBlock ? rows : (rows + 1) / 2;
  for (std::int64_t n = n0; n < n1; n += kStripSpan) {
    const std::int64_t cols = std::min(kStripSpan, n1 - n);
    if (pairs == 0) std::fill(sums, sums + rows * kStripSumsStride, 0.0f);
    for (std::int64_t p0 = 0; p0 < pairs; p0 += kStripBand) {
      const std::int64_t p1 = std::min(pairs, p0 + kStripBand);
      StripBand band;
      band.b = data + ((k0 + 2 * p0) * b.k_stride + n) * kElement;
      band.row_bytes = b.k_stride * kElement;
      band.rows_left = kc - 2 * p0;
      band.pairs = p1 - p0;
      band.cols = cols;
      band.a_pairs = a_pairs;
      band.first = p0 == 0;
      // the first block's strips prefetch the next band whole; later blocks find it spent
      RowPrefetcher next_band(b, k0 + 2 * (p0 + kStripBand), k0 + 2 * (p1 + kStripBand), n, cols,
                              kElement, (cols + 15) / 16);
      for (int i0 = 0; i0 < rows; i0 += block) {
        const int block_rows = std::min(block, rows - i0);
        for (std::int64_t s = 0; s < band.pairs; ++s) {
          for (int i = 0; i < block_rows; ++i) {
            std::memcpy(&a_pairs[s * block_rows + i], a + (i0 + i) * a_stride + 2 * (p0 + s),
                        sizeof(std::int32_t));
          }
        }
        band.sums = sums + i0 * kStripSumsStride;
        band_of_width[block_rows - kStripMinBlock](band, next_band);
      }
    }
    for (int i = 0; i < rows; ++i) {
      stream_store_span(c + i * ldc + (n - n0), sums + i * kStripSumsStride, row_scales[i],
                        col_scales + (n - n0), cols, first);
    }
  }
}

// Contraction-contiguous B: blocks of kCols columns, each column's run read 64 indices at a time
// as two vectors of pairs, any dtype.
template <DType kDtype, int kRows, int kCols>
GMM_TARGET_AVX512BF16 void stream_bf16_runs(const PanelSource& b, std::int64_t n0, std::int64_t n1,
                                            const StreamChunk* chunks, std::int64_t count, float* c,
                                            std::int64_t ldc, bool first) {
  const std::int64_t element = static_cast<std::int64_t>(size_of(kDtype));
  for (std::int64_t n = n0; n < n1; n += kCols) {
    const std::int64_t cols = std::min<std::int64_t>(kCols, n1 - n);
    __m512 totals[kRows][kCols];
    zero_sums(totals);
    for (std::int64_t s = 0; s < count; ++s) {
      const std::int64_t k0 = chunks[s].k0, kc = chunks[s].kc, a_stride = chunks[s].a_stride;
      const auto* a = static_cast<const std::uint16_t*>(chunks[s].a);
      __m512 acc[kRows][kCols];
      zero_sums(acc);
      for (std::int64_t k = 0; k < kc; k += 64) {
        __m512i av[kRows][2];
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) {
          for (int h = 0; h < 2; ++h) {
            av[i][h] = _mm512_maskz_loadu_epi16(first_words(kc - k - 32 * h),
                                                a + i * a_stride + k + 32 * h);
          }
        }
#pragma GCC unroll 8
        for (int j = 0; j < kCols; ++j) {
          if (j >= cols) break;
          const std::int64_t index = (n + j) * b.lane_stride + (k0 + k) * b.k_stride;
          _mm_prefetch(static_cast<const char*>(b.data) + (index + 256) * element, _MM_HINT_T1);
#pragma GCC unroll 2
          for (int h = 0; h < 2; ++h) {
            const __m512i bv = run_pairs<kDtype>(b.data, index + 32 * h, kc - k - 32 * h);
#pragma GCC unroll 4
            for (int i = 0; i < kRows; ++i) {
              acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)av[i][h], (__m512bh)bv);
            }
          }
        }
      }
      stream_finish_chunk<kRows, kCols>(c + (n - n0), ldc, totals, acc, chunks[s], s, count, n - n0,
                                        cols, first);
    }
  }
}

// Contraction-contiguous fp8 B: blocks of kCols columns (even), two columns' runs of 64
// indices widened at a time by widen_fp8_runs.
template <DType kFp8, int kRows, int kCols>
GMM_TARGET_AVX512VBMI void stream_bf16_runs_fp8(const PanelSource& b, std::int64_t n0,
                                                std::int64_t n1, const StreamChunk* chunks,
                                                std::int64_t count, float* c, std::int64_t ldc,
                                                bool first) {
  const Fp8Widener widener = fp8_widener<kFp8>();
  const auto* data = static_cast<const std::uint8_t*>(b.data);
  for (std::int64_t n = n0; n < n1; n += kCols) {
    const std::int64_t cols = std::min<std::int64_t>(kCols, n1 - n);
    __m512 totals[kRows][kCols];
    zero_sums(totals);
    for (std::int64_t s = 0; s < count; ++s) {
      const std::int64_t k0 = chunks[s].k0, kc = chunks[s].kc, a_stride = chunks[s].a_stride;
      const auto* a = static_cast<const std::uint16_t*>(chunks[s].a);
      __m512 acc[kRows][kCols];
      zero_sums(acc);
      for (std::int64_t k = 0; k < kc; k += 64) {
        const __mmask64 mask = first_bytes(kc - k);
        __m512i av[kRows][2];
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) {
          for (int h = 0; h < 2; ++h) {
            av[i][h] = _mm512_maskz_loadu_epi16(first_words(kc - k - 32 * h),
                                                a + i * a_stride + k + 32 * h);
          }
        }
#pragma GCC unroll 4
        for (int j = 0; j < kCols; j += 2) {
          if (j >= cols) break;
          const std::uint8_t* x = data + (n + j) * b.lane_stride + k0 + k;
          _mm_prefetch(reinterpret_cast<const char*>(x + 256), _MM_HINT_T1);
          if (j + 1 < cols)
            _mm_prefetch(reinterpret_cast<const char*>(x + b.lane_stride + 256), _MM_HINT_T1);
          __m512i bv[4];  // column j's then j + 1's pairs of k .. k + 31, then of k + 32 .. k + 63
          widen_fp8_runs(_mm512_maskz_loadu_epi8(mask, x),
                         _mm512_maskz_loadu_epi8(j + 1 < cols ? mask : 0, x + b.lane_stride),
                         widener, bv);
#pragma GCC unroll 4
          for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
              acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)av[i][h], (__m512bh)bv[2 * h]);
              acc[i][j + 1] =
                  _mm512_dpbf16_ps(acc[i][j + 1], (__m512bh)av[i][h], (__m512bh)bv[2 * h + 1]);
            }
          }
        }
      }
      stream_finish_chunk<kRows, kCols>(c + (n - n0), ldc, totals, acc, chunks[s], s, count, n - n0,
                                        cols, first);
    }
  }
}

// ---- fp32 FMA kernels (the AVX-512F kit) ------------------------------------------------------

// Lanes-contiguous B (see kStreamBand, a band here being 2 * kStreamBand contraction indices):
// blocks of 16 * kNv columns, one vector per 16 columns and contraction index, widened exactly
// from any dtype.
template <DType kDtype, int kRows, int kNv>
GMM_TARGET_AVX512 void stream_f32_lanes(const PanelSource& b, std::int64_t n0, std::int64_t n1,
                                        std::int64_t k0, std::int64_t kc, const float* a,
                                        std::int64_t a_stride, float* c, std::int64_t ldc,
                                        const float* row_scales, const float* col_scales,
                                        bool first) {
  constexpr std::int64_t kBlock = 16 * kNv, kBandRows = 2 * kStreamBand;
  alignas(64) float sums[kRows][kStreamSpan];
  const std::int64_t element = static_cast<std::int64_t>(size_of(kDtype));
  for (std::int64_t n = n0; n < n1; n += kStreamSpan) {
    const std::int64_t cols = std::min(kStreamSpan, n1 - n);
    const std::int64_t blocks = (cols + kBlock - 1) / kBlock;
    for (int i = 0; i < kRows; ++i) std::fill(sums[i], sums[i] + blocks * kBlock, 0.0f);
    for (std::int64_t r0 = 0; r0 < kc; r0 += kBandRows) {
      const std::int64_t r1 = std::min(kc, r0 + kBandRows);
      RowPrefetcher next_band(b, k0 + r0 + kBandRows, k0 + r1 + kBandRows, n, cols, element,
                              blocks);
      for (std::int64_t block = 0; block < blocks; ++block) {
        const std::int64_t j = block * kBlock;
        next_band.next_part();
        __m512 acc[kRows][kNv];
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 8
          for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_load_ps(sums[i] + j + 16 * v);
        }
        for (std::int64_t k = r0; k < r1; ++k) {
          const std::int64_t index = (k0 + k) * b.k_stride + (n + j) * b.lane_stride;
          __m512 bv[kNv];
#pragma GCC unroll 8
          for (int v = 0; v < kNv; ++v) {
            bv[v] = load16_lanes<kDtype>(b, index + 16 * v * b.lane_stride,
                                         first_lanes(cols - j - 16 * v));
          }
#pragma GCC unroll 4
          for (int i = 0; i < kRows; ++i) {
            const __m512 av = _mm512_set1_ps(a[i * a_stride + k]);
#pragma GCC unroll 8
            for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
          }
        }
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 8
          for (int v = 0; v < kNv; ++v) _mm512_store_ps(sums[i] + j + 16 * v, acc[i][v]);
        }
      }
    }
    for (int i = 0; i < kRows; ++i) {
      stream_store_span(c + i * ldc + (n - n0), sums[i], row_scales[i], col_scales + (n - n0), cols,
                        first);
    }
  }
}

// Lanes-contiguous fp8 B on a CPU with AVX512_VBMI (see stream_f32_lanes): 64 columns of a
// contraction row widened at a time by the table lookups (lookup_bf16), the bf16 words then
// widened to fp32 in-lane, so each vector holds in its 128-bit lane L columns 16L + 4v .. 16L + 4v
// + 3, the order of widen_fp8_lanes (stream_store_span_fp8 puts them back). Nine instructions
// widen 64 values where fp8_to_f32 takes about fifty: the widening bounded stream_f32_lanes on fp8
// decode (8 GB/s of weights on Ice Lake, 2 threads).
template <DType kFp8, int kRows, int kNv>
GMM_TARGET_VBMI_WIDEN void stream_f32_lanes_fp8(const PanelSource& b, std::int64_t n0,
                                                std::int64_t n1, std::int64_t k0, std::int64_t kc,
                                                const float* a, std::int64_t a_stride, float* c,
                                                std::int64_t ldc, const float* row_scales,
                                                const float* col_scales, bool first) {
  static_assert(kNv % 4 == 0, "blocks of whole 64-column widenings");
  constexpr std::int64_t kBlock = 16 * kNv, kBandRows = 2 * kStreamBand;
  alignas(64) float sums[kRows][kStreamSpan];
  const Fp8Widener widener = fp8_widener<kFp8>();
  const auto* data = static_cast<const std::uint8_t*>(b.data);
  const __m512i zero = _mm512_setzero_si512();
  for (std::int64_t n = n0; n < n1; n += kStreamSpan) {
    const std::int64_t cols = std::min(kStreamSpan, n1 - n);
    const std::int64_t blocks = (cols + kBlock - 1) / kBlock;
    for (int i = 0; i < kRows; ++i) std::fill(sums[i], sums[i] + blocks * kBlock, 0.0f);
    for (std::int64_t r0 = 0; r0 < kc; r0 += kBandRows) {
      const std::int64_t r1 = std::min(kc, r0 + kBandRows);
      RowPrefetcher next_band(b, k0 + r0 + kBandRows, k0 + r1 + kBandRows, n, cols, 1, blocks);
      for (std::int64_t block = 0; block < blocks; ++block) {
        const std::int64_t j = block * kBlock;
        next_band.next_part();
        __m512 acc[kRows][kNv];
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 8
          for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_load_ps(sums[i] + j + 16 * v);
        }
        for (std::int64_t k = r0; k < r1; ++k) {
          const std::uint8_t* row = data + (k0 + k) * b.k_stride + n + j;
#pragma GCC unroll 2
          for (int u = 0; u < kNv / 4; ++u) {
            __m512i words[2];
            lookup_bf16(_mm512_maskz_loadu_epi8(first_bytes(cols - j - 64 * u), row + 64 * u),
                        widener, words[0], words[1]);
            __m512 bv[4];
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
              bv[2 * h] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, words[h]));
              bv[2 * h + 1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, words[h]));
            }
#pragma GCC unroll 4
            for (int i = 0; i < kRows; ++i) {
              const __m512 av = _mm512_set1_ps(a[i * a_stride + k]);
#pragma GCC unroll 4
              for (int v = 0; v < 4; ++v) {
                acc[i][4 * u + v] = _mm512_fmadd_ps(av, bv[v], acc[i][4 * u + v]);
              }
            }
          }
        }
#pragma GCC unroll 4
        for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 8
          for (int v = 0; v < kNv; ++v) _mm512_store_ps(sums[i] + j + 16 * v, acc[i][v]);
        }
      }
    }
    for (int i = 0; i < kRows; ++i) {
      stream_store_span_fp8(c + i * ldc + (n - n0), sums[i], row_scales[i], col_scales + (n - n0),
                            cols, first);
    }
  }
}

// Contraction-contiguous B: blocks of kCols columns, each column's run read 64 indices at a time
// as four vectors, widened exactly from any dtype.
template <DType kDtype, int kRows, int kCols>
GMM_TARGET_AVX512 void stream_f32_runs(const PanelSource& b, std::int64_t n0, std::int64_t n1,
                                       const StreamChunk* chunks, std::int64_t count, float* c,
                                       std::int64_t ldc, bool first) {
  const std::int64_t element = static_cast<std::int64_t>(size_of(kDtype));
  for (std::int64_t n = n0; n < n1; n += kCols) {
    const std::int64_t cols = std::min<std::int64_t>(kCols, n1 - n);
    __m512 totals[kRows][kCols];
    zero_sums(totals);
    for (std::int64_t s = 0; s < count; ++s) {
      const std::int64_t k0 = chunks[s].k0, kc = chunks[s].kc, a_stride = chunks[s].a_stride;
      const auto* a = static_cast<const float*>(chunks[s].a);
      __m512 acc[kRows][kCols];
      zero_sums(acc);
      for (std::int64_t k = 0; k < kc; k += 64) {
#pragma GCC unroll 8
        for (int j = 0; j < kCols; ++j) {
          if (j >= cols) break;
          const std::int64_t index = (n + j) * b.lane_stride + (k0 + k) * b.k_stride;
          _mm_prefetch(static_cast<const char*>(b.data) + (index + 256) * element, _MM_HINT_T1);
#pragma GCC unroll 4
          for (int q = 0; q < 4; ++q) {
            const __mmask16 mask = first_lanes(kc - k - 16 * q);
            const __m512 bv = load16<kDtype>(b.data, index + 16 * q, mask);
#pragma GCC unroll 4
            for (int i = 0; i < kRows; ++i) {
              const __m512 av = _mm512_maskz_loadu_ps(mask, a + i * a_stride + k + 16 * q);
              acc[i][j] = _mm512_fmadd_ps(av, bv, acc[i][j]);
            }
          }
        }
      }
      stream_finish_chunk<kRows, kCols>(c + (n - n0), ldc, totals, acc, chunks[s], s, count, n - n0,
                                        cols, first);
    }
  }
}

// Indices of one vpermb that reorders 64 contraction codes so that lookup_bf16 and the in-lane
// word unpacks of stream_f32_runs_fp8 emit them in order: vector v holds indices 16v .. 16v + 15
// (lane L, element e of vector v comes from position 16L + 4v + e of the reordered codes).
struct Fp8RunOrder {
  alignas(64) std::uint8_t index[64];
  Fp8RunOrder() {
    for (int lane = 0; lane < 4; ++lane) {
      for (int v = 0; v < 4; ++v) {
        for (int e = 0; e < 4; ++e) {
          index[16 * lane + 4 * v + e] = static_cast<std::uint8_t>(16 * v + 4 * lane + e);
        }
      }
    }
  }
};

// Contraction-contiguous fp8 B on a CPU with AVX512_VBMI (see stream_f32_runs): each column's 64
// codes reordered (vpermb) and widened by the table lookups into the four vectors
// stream_f32_runs loads, in the same order, so the sums are bit-identical to it. On Ice Lake the
// widening by fp8_to_f32 held the fp8 decode dlhs to 10 GB/s of weights (2 threads).
template <DType kFp8, int kRows, int kCols>
GMM_TARGET_VBMI_WIDEN void stream_f32_runs_fp8(const PanelSource& b, std::int64_t n0,
                                               std::int64_t n1, const StreamChunk* chunks,
                                               std::int64_t count, float* c, std::int64_t ldc,
                                               bool first) {
  static const Fp8RunOrder run_order;
  const Fp8Widener widener = fp8_widener<kFp8>();
  const __m512i order = _mm512_load_si512(run_order.index);
  const __m512i zero = _mm512_setzero_si512();
  const auto* data = static_cast<const std::uint8_t*>(b.data);
  for (std::int64_t n = n0; n < n1; n += kCols) {
    const std::int64_t cols = std::min<std::int64_t>(kCols, n1 - n);
    __m512 totals[kRows][kCols];
    zero_sums(totals);
    for (std::int64_t s = 0; s < count; ++s) {
      const std::int64_t k0 = chunks[s].k0, kc = chunks[s].kc, a_stride = chunks[s].a_stride;
      const auto* a = static_cast<const float*>(chunks[s].a);
      __m512 acc[kRows][kCols];
      zero_sums(acc);
      for (std::int64_t k = 0; k < kc; k += 64) {
#pragma GCC unroll 8
        for (int j = 0; j < kCols; ++j) {
          if (j >= cols) break;
          const std::uint8_t* run = data + (n + j) * b.lane_stride + (k0 + k) * b.k_stride;
          _mm_prefetch(reinterpret_cast<const char*>(run + 256), _MM_HINT_T1);
          __m512i words[2];
          lookup_bf16(
              _mm512_permutexvar_epi8(order, _mm512_maskz_loadu_epi8(first_bytes(kc - k), run)),
              widener, words[0], words[1]);
          const __m512 bv[4] = {_mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, words[0])),
                                _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, words[0])),
                                _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, words[1])),
                                _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, words[1]))};
#pragma GCC unroll 4
          for (int q = 0; q < 4; ++q) {
            const __mmask16 mask = first_lanes(kc - k - 16 * q);
#pragma GCC unroll 4
            for (int i = 0; i < kRows; ++i) {
              const __m512 av = _mm512_maskz_loadu_ps(mask, a + i * a_stride + k + 16 * q);
              acc[i][j] = _mm512_fmadd_ps(av, bv[q], acc[i][j]);
            }
          }
        }
      }
      stream_finish_chunk<kRows, kCols>(c + (n - n0), ldc, totals, acc, chunks[s], s, count, n - n0,
                                        cols, first);
    }
  }
}

// ---- Dispatch -------------------------------------------------------------------------------

// Picks the kernel of a row count: kRows = 1 .. 4.
template <template <int> class kKernel>
inline void stream_rows_dispatch(int rows, const PanelSource& b, std::int64_t n0, std::int64_t n1,
                                 const StreamChunk* chunks, std::int64_t count, float* c,
                                 std::int64_t ldc, bool first) {
  switch (rows) {
    case 1:
      return kKernel<1>::run(b, n0, n1, chunks, count, c, ldc, first);
    case 2:
      return kKernel<2>::run(b, n0, n1, chunks, count, c, ldc, first);
    case 3:
      return kKernel<3>::run(b, n0, n1, chunks, count, c, ldc, first);
    default:
      return kKernel<4>::run(b, n0, n1, chunks, count, c, ldc, first);
  }
}

// True when B takes the strip kernel: lanes-contiguous bf16 or fp8, on a CPU with AVX512_VBMI
// (the fp8 table widening; the kernel is compiled for it).
inline bool strips_take(const PanelSource& b) {
  return b.k_stride != 1 && b.lane_stride == 1 && cpu_features().avx512vbmi &&
         (b.dtype == DType::bf16 || b.dtype == DType::float8_e4m3fn ||
          b.dtype == DType::float8_e5m2);
}

// KernelKit::stream_rows of the AVX512_BF16 kit.
inline int stream_rows_avx512_bf16(const PanelSource& b) { return strips_take(b) ? kStripRows : 4; }

// Column blocking per row count: accumulators and widened B stay within the 32 registers.
constexpr int stream_lane_vectors(int rows) { return rows <= 2 ? 8 : 4; }
constexpr int stream_run_columns(int rows) { return rows == 1 ? 8 : 4; }

// The row-count templates of each kernel family, with its B dtype and layout fixed. The runs
// kernels take all the chunks at once (stream_finish_chunk); the lanes kernels, which sum each
// column as the packed micro-kernel does, one chunk after the other.
template <DType kDtype, bool kRuns, bool kFp8Tables>
struct StreamBf16 {
  template <int kRows>
  struct Kernel {
    static void run(const PanelSource& b, std::int64_t n0, std::int64_t n1,
                    const StreamChunk* chunks, std::int64_t count, float* c, std::int64_t ldc,
                    bool first) {
      constexpr int kNv = stream_lane_vectors(kRows), kCols = stream_run_columns(kRows);
      if constexpr (kRuns && kFp8Tables) {
        return stream_bf16_runs_fp8<kDtype, kRows, kCols>(b, n0, n1, chunks, count, c, ldc, first);
      } else if constexpr (kRuns) {
        return stream_bf16_runs<kDtype, kRows, kCols>(b, n0, n1, chunks, count, c, ldc, first);
      }
      for (std::int64_t s = 0; s < count; ++s) {
        const StreamChunk& k = chunks[s];
        const auto* pairs = static_cast<const std::uint16_t*>(k.a);
        if constexpr (kFp8Tables) {
          stream_bf16_lanes_fp8<kDtype, kRows, kNv>(b, n0, n1, k.k0, k.kc, pairs, k.a_stride, c,
                                                    ldc, k.row_scales, k.col_scales,
                                                    first && s == 0);
        } else {
          stream_bf16_lanes<kDtype, kRows, kNv>(b, n0, n1, k.k0, k.kc, pairs, k.a_stride, c, ldc,
                                                k.row_scales, k.col_scales, first && s == 0);
        }
      }
    }
  };
};

template <DType kDtype, bool kRuns, bool kFp8Tables = false>
struct StreamF32 {
  template <int kRows>
  struct Kernel {
    static void run(const PanelSource& b, std::int64_t n0, std::int64_t n1,
                    const StreamChunk* chunks, std::int64_t count, float* c, std::int64_t ldc,
                    bool first) {
      constexpr int kNv = stream_lane_vectors(kRows), kCols = stream_run_columns(kRows);
      if constexpr (kRuns && kFp8Tables) {
        return stream_f32_runs_fp8<kDtype, kRows, kCols>(b, n0, n1, chunks, count, c, ldc, first);
      } else if constexpr (kRuns) {
        return stream_f32_runs<kDtype, kRows, kCols>(b, n0, n1, chunks, count, c, ldc, first);
      }
      for (std::int64_t s = 0; s < count; ++s) {
        const StreamChunk& k = chunks[s];
        const auto* values = static_cast<const float*>(k.a);
        if constexpr (kFp8Tables) {
          stream_f32_lanes_fp8<kDtype, kRows, kNv>(b, n0, n1, k.k0, k.kc, values, k.a_stride, c,
                                                   ldc, k.row_scales, k.col_scales,
                                                   first && s == 0);
        } else {
          stream_f32_lanes<kDtype, kRows, kNv>(b, n0, n1, k.k0, k.kc, values, k.a_stride, c, ldc,
                                               k.row_scales, k.col_scales, first && s == 0);
        }
      }
    }
  };
};

// KernelKit::stream of the AVX512_BF16 (and AMX) kits on a CPU with the given features: B's dtype
// and layout pick the kernel; fp8 with contiguous columns or runs widens through the vpermi2b
// tables where the CPU has AVX512_VBMI; more than 4 rows (stream_rows_avx512_bf16, only with
// AVX512_VBMI) take the strip kernel.
inline void stream_avx512_bf16_on(const CpuFeatures& cpu, const PanelSource& b, std::int64_t n0,
                                  std::int64_t n1, const StreamChunk* chunks, std::int64_t count,
                                  int rows, float* c, std::int64_t ldc, bool first) {
  if (rows >= kStripMinBlock) {  // stream_rows_avx512_bf16: strips_take(b)
    const auto strips = b.dtype == DType::float8_e4m3fn ? stream_bf16_strips<DType::float8_e4m3fn>
                        : b.dtype == DType::float8_e5m2 ? stream_bf16_strips<DType::float8_e5m2>
                                                        : stream_bf16_strips<DType::bf16>;
    for (std::int64_t s = 0; s < count; ++s) {
      const StreamChunk& k = chunks[s];
      strips(b, n0, n1, k.k0, k.kc, static_cast<const std::uint16_t*>(k.a), k.a_stride, rows, c,
             ldc, k.row_scales, k.col_scales, first && s == 0);
    }
    return;
  }
  const bool runs = b.k_stride == 1;
  const bool tables = cpu.avx512vbmi && (runs || b.lane_stride == 1);
#define GMM_STREAM(D, RUNS, TABLES)                                                           \
  stream_rows_dispatch<StreamBf16<D, RUNS, TABLES>::template Kernel>(rows, b, n0, n1, chunks, \
                                                                     count, c, ldc, first)
#define GMM_STREAM_LAYOUTS(D, TABLES) \
  return runs ? GMM_STREAM(D, true, TABLES) : GMM_STREAM(D, false, TABLES)
  switch (b.dtype) {
    case DType::f32:
      GMM_STREAM_LAYOUTS(DType::f32, false);
    case DType::bf16:
      GMM_STREAM_LAYOUTS(DType::bf16, false);
    case DType::float8_e4m3fn:
      if (tables) GMM_STREAM_LAYOUTS(DType::float8_e4m3fn, true);
      GMM_STREAM_LAYOUTS(DType::float8_e4m3fn, false);
    case DType::float8_e5m2:
      if (tables) GMM_STREAM_LAYOUTS(DType::float8_e5m2, true);
      GMM_STREAM_LAYOUTS(DType::float8_e5m2, false);
    case DType::int8:
      GMM_STREAM_LAYOUTS(DType::int8, false);
  }
#undef GMM_STREAM_LAYOUTS
#undef GMM_STREAM
}

inline void stream_avx512_bf16(const PanelSource& b, std::int64_t n0, std::int64_t n1,
                               const StreamChunk* chunks, std::int64_t count, int rows, float* c,
                               std::int64_t ldc, bool first) {
  stream_avx512_bf16_on(cpu_features(), b, n0, n1, chunks, count, rows, c, ldc, first);
}

// KernelKit::stream of the AVX-512F kit on a CPU with the given features: B's dtype and layout
// pick the kernel; fp8 with contiguous columns or runs widens through the vpermi2b tables where
// the CPU has AVX512_VBMI.
inline void stream_avx512_f32_on(const CpuFeatures& cpu, const PanelSource& b, std::int64_t n0,
                                 std::int64_t n1, const StreamChunk* chunks, std::int64_t count,
                                 int rows, float* c, std::int64_t ldc, bool first) {
  const bool runs = b.k_stride == 1;
  const bool tables = cpu.avx512vbmi && (runs || b.lane_stride == 1);
#define GMM_STREAM(D, RUNS, TABLES)                                                          \
  stream_rows_dispatch<StreamF32<D, RUNS, TABLES>::template Kernel>(rows, b, n0, n1, chunks, \
                                                                    count, c, ldc, first)
#define GMM_STREAM_LAYOUTS(D, TABLES) \
  return runs ? GMM_STREAM(D, true, TABLES) : GMM_STREAM(D, false, TABLES)
  switch (b.dtype) {
    case DType::f32:
      GMM_STREAM_LAYOUTS(DType::f32, false);
    case DType::bf16:
      GMM_STREAM_LAYOUTS(DType::bf16, false);
    case DType::float8_e4m3fn:
      if (tables) GMM_STREAM_LAYOUTS(DType::float8_e4m3fn, true);
      GMM_STREAM_LAYOUTS(DType::float8_e4m3fn, false);
    case DType::float8_e5m2:
      if (tables) GMM_STREAM_LAYOUTS(DType::float8_e5m2, true);
      GMM_STREAM_LAYOUTS(DType::float8_e5m2, false);
    case DType::int8:
      GMM_STREAM_LAYOUTS(DType::int8, false);
  }
#undef GMM_STREAM_LAYOUTS
#undef GMM_STREAM
}

inline void stream_avx512_f32(const PanelSource& b, std::int64_t n0, std::int64_t n1,
                              const StreamChunk* chunks, std::int64_t count, int rows, float* c,
                              std::int64_t ldc, bool first) {
  stream_avx512_f32_on(cpu_features(), b, n0, n1, chunks, count, rows, c, ldc, first);
}

}  // namespace gmm::kernels

GMM_KERNELS_RESTORE_WARNINGS
#endif
