// fp8 widening by 128-entry table lookups (AVX512_VBMI vpermi2b), shared by the B packers and the
// streaming kernels, and those B packers themselves (bf16 pairs, and the AVX-512F kit's fp32).
#pragma once

#include <algorithm>
#include <cstdint>

#include "gmm/kernels/avx512.hpp"
#include "gmm/kernels/cpu.hpp"
#include "gmm/kernels/format.hpp"
#include "gmm/kernels/reference.hpp"

#if GMM_KERNELS_X86
#define GMM_TARGET_AVX512VBMI \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx512bf16,avx512vbmi")))
// The table widening alone, without AVX512_BF16: a subset of the target above, so the bf16 kits'
// kernels inline it, and the AVX-512F kit's fp32 kernels use it on CPUs with AVX512_VBMI but not
// AVX512_BF16 (Ice Lake).
#define GMM_TARGET_VBMI_WIDEN \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx512vbmi")))

GMM_KERNELS_SILENCE_UNDEFINED_WARNINGS

namespace gmm::kernels {

// bf16 bits of the 128 fp8 magnitudes, split into high and low bytes: the tables of every
// vpermi2b widening (NaN codes give the canonical quiet NaN, e5m2 infinities stay infinite).
template <DType kFp8>
struct Fp8Bf16Bytes {
  alignas(64) std::uint8_t high[128];
  alignas(64) std::uint8_t low[128];
  Fp8Bf16Bytes() {
    for (int m = 0; m < 128; ++m) {
      const std::uint8_t code = static_cast<std::uint8_t>(m);
      const std::uint16_t bits = bf16_bits(load_as_float(&code, kFp8, 0));
      high[m] = static_cast<std::uint8_t>(bits >> 8);
      low[m] = static_cast<std::uint8_t>(bits & 0xFF);
    }
  }
};

// Which of two 32-byte runs x (0..31) and y (32..63) the zips below put at byte `pos` of a
// vector, so that lookup_bf16's in-lane unpacks (bytes 0..7 of each 128-bit lane, then 8..15)
// emit the words of x in order, then those of y: x's byte 8L + i at 16L + i for i < 8, y's
// byte 8L + i - 8 for i >= 8.
constexpr int unpack_order(int pos) {
  const int lane = pos / 16, i = pos % 16;
  return i < 8 ? 8 * lane + i : 32 + 8 * lane + i - 8;
}

// vpermt2b indices zipping the contraction runs k .. k + 63 of two columns (x, y) so that the
// in-lane byte unpacks after the table lookups emit bf16 pairs in order: zip h gives x's then
// y's pairs of contraction 32h .. 32h + 31.
struct Fp8Zip {
  alignas(64) std::uint8_t runs[2][64];
  Fp8Zip() {
    for (int h = 0; h < 2; ++h) {
      for (int pos = 0; pos < 64; ++pos) {
        const int q = unpack_order(pos);  // x's byte 32h + q, or y's byte 32h + q - 32
        runs[h][pos] = static_cast<std::uint8_t>(q < 32 ? 32 * h + q : 64 + 32 * h + q - 32);
      }
    }
  }
};

// The registers of the fp8 widening: the two halves of both lookup tables and the run zips.
struct Fp8Widener {
  __m512i high0, high1, low0, low1, zip0, zip1;
};

template <DType kFp8>
GMM_TARGET_VBMI_WIDEN inline Fp8Widener fp8_widener() {
  static const Fp8Bf16Bytes<kFp8> table;
  static const Fp8Zip zip;
  return {_mm512_load_si512(table.high),  _mm512_load_si512(table.high + 64),
          _mm512_load_si512(table.low),   _mm512_load_si512(table.low + 64),
          _mm512_load_si512(zip.runs[0]), _mm512_load_si512(zip.runs[1])};
}

// The high and low bytes of the bf16 bits of 64 fp8 codes: two 128-entry lookups (vpermi2b, the
// sign bit merged back into the high bytes by one ternary logic op).
GMM_TARGET_VBMI_WIDEN inline void lookup_bf16_bytes(__m512i codes, const Fp8Widener& t,
                                                    __m512i& high, __m512i& low) {
  high = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t.high0, codes, t.high1), codes,
                                   _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);
  low = _mm512_permutex2var_epi8(t.low0, codes, t.low1);
}

// The bf16 words of 64 fp8 codes (lookup_bf16_bytes): the words of bytes 0..7 of each 128-bit
// lane (first) and of bytes 8..15 (second).
GMM_TARGET_VBMI_WIDEN inline void lookup_bf16(__m512i codes, const Fp8Widener& t, __m512i& first,
                                              __m512i& second) {
  __m512i high, low;
  lookup_bf16_bytes(codes, t, high, low);
  first = _mm512_unpacklo_epi8(low, high);
  second = _mm512_unpackhi_epi8(low, high);
}

// bf16 pairs of two contraction rows x, y over 64 columns, zipped in-lane (no cross-lane
// shuffle): out[v] holds in its 128-bit lane L the pairs of columns 16L + 4v .. 16L + 4v + 3
// (stream_store_span_fp8 puts the columns back in order).
GMM_TARGET_AVX512VBMI inline void widen_fp8_lanes(__m512i x, __m512i y, const Fp8Widener& t,
                                                  __m512i (&out)[4]) {
  lookup_bf16(_mm512_unpacklo_epi8(x, y), t, out[0], out[1]);
  lookup_bf16(_mm512_unpackhi_epi8(x, y), t, out[2], out[3]);
}

// bf16 pairs of the contraction runs of two columns x, y (64 indices each): x's pairs of
// contraction 0 .. 31, y's, x's of 32 .. 63, y's.
GMM_TARGET_AVX512VBMI inline void widen_fp8_runs(__m512i x, __m512i y, const Fp8Widener& t,
                                                 __m512i (&out)[4]) {
  lookup_bf16(_mm512_permutex2var_epi8(x, t.zip0, y), t, out[0], out[1]);
  lookup_bf16(_mm512_permutex2var_epi8(x, t.zip1, y), t, out[2], out[3]);
}

// vpermt2b indices that spread the bf16 bytes of 64 looked-up fp8 values (low bytes in the first
// table, high bytes in the second) into the upper halves of fp32 words, in order: quarter v
// takes values 16v .. 16v + 15 (the lower halves are zeroed by the mask kFp32UpperHalves).
struct Fp8F32Spread {
  alignas(64) std::uint8_t quarter[4][64];
  Fp8F32Spread() {
    for (int v = 0; v < 4; ++v) {
      for (int j = 0; j < 16; ++j) {
        quarter[v][4 * j] = 0;
        quarter[v][4 * j + 1] = 0;
        quarter[v][4 * j + 2] = static_cast<std::uint8_t>(16 * v + j);
        quarter[v][4 * j + 3] = static_cast<std::uint8_t>(64 + 16 * v + j);
      }
    }
  }
};

// Bytes 2 and 3 of every 32-bit word.
constexpr __mmask64 kFp32UpperHalves = 0xCCCCCCCCCCCCCCCCull;

// The registers of widen_fp8_f32: the lookup tables and the four spreads.
struct Fp8F32Widener {
  Fp8Widener tables;
  __m512i spread[4];
};

// The registers of widen_fp8_f32 for one fp8 type.
template <DType kFp8>
GMM_TARGET_VBMI_WIDEN inline Fp8F32Widener fp8_f32_widener() {
  static const Fp8F32Spread spread;
  Fp8F32Widener w{fp8_widener<kFp8>(), {}};
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) w.spread[v] = _mm512_load_si512(spread.quarter[v]);
  return w;
}

// The exact fp32 values of 64 fp8 codes, in order (out[v]: codes 16v .. 16v + 15): the two table
// lookups of lookup_bf16_bytes, then one masked vpermt2b per vector.
GMM_TARGET_VBMI_WIDEN inline void widen_fp8_f32(__m512i codes, const Fp8F32Widener& w,
                                                __m512 (&out)[4]) {
  __m512i high, low;
  lookup_bf16_bytes(codes, w.tables, high, low);
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    out[v] = _mm512_castsi512_ps(
        _mm512_maskz_permutex2var_epi8(kFp32UpperHalves, low, w.spread[v], high));
  }
}

// Packs 64-lane fp32 B panels from an unquantized fp8 source whose lanes are contiguous ([K, N]
// weights, the AVX-512F kit on CPUs with AVX512_VBMI): each contraction row's 64 lanes of a panel
// are widened by widen_fp8_f32 (about 7 instructions where fp8_to_f32 takes about 50; the
// arithmetic widening was 4.9% of the compute-bound fp8 forward on Ice Lake, 2 threads) and
// stored as the panel's step. Steps in blocks of kPackStepBlock, as pack_b_pairs_lanes takes them.
template <DType kFp8>
GMM_TARGET_VBMI_WIDEN void pack_b_f32_fp8_lanes(const PanelSource& src, std::int64_t lane0,
                                                std::int64_t lanes, std::int64_t k0,
                                                std::int64_t kc, float* out) {
  constexpr std::int64_t kWidth = 64;
  const Fp8F32Widener widener = fp8_f32_widener<kFp8>();
  const std::int64_t panels = (lanes + kWidth - 1) / kWidth;
  const auto* data = static_cast<const std::uint8_t*>(src.data) + lane0;
  for (std::int64_t s0 = 0; s0 < kc; s0 += kPackStepBlock) {
    const std::int64_t s1 = std::min(kc, s0 + kPackStepBlock);
    const std::int64_t ahead0 = k0 + s0 + kPackStepBlock;
    const std::int64_t ahead1 = std::min(k0 + kc, ahead0 + kPackStepBlock);
    for (std::int64_t p = 0; p < panels; ++p) {
      const __mmask64 live = first_bytes(lanes - kWidth * p);
      for (std::int64_t row = ahead0; row < ahead1; ++row) {  // the next block's rows
        _mm_prefetch(reinterpret_cast<const char*>(data + row * src.k_stride + kWidth * p),
                     _MM_HINT_T0);
      }
      for (std::int64_t s = s0; s < s1; ++s) {
        __m512 values[4];
        widen_fp8_f32(_mm512_maskz_loadu_epi8(live, data + (k0 + s) * src.k_stride + kWidth * p),
                      widener, values);
        float* dst = out + (p * kc + s) * kWidth;
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) _mm512_storeu_ps(dst + 16 * v, values[v]);
      }
    }
  }
}

// One stage of transpose_bytes16: elements of kBits bits of the rows kBits / 8 apart interleaved,
// low halves of each 128-bit lane into out[2i], high halves into out[2i + 1].
template <int kBits>
GMM_TARGET_VBMI_WIDEN inline void interleave_stage(const __m512i (&in)[16], __m512i (&out)[16]) {
  constexpr int kDistance = kBits / 8;
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    const int x = i / kDistance * 2 * kDistance + i % kDistance;
    const __m512i a = in[x], b = in[x + kDistance];
    if constexpr (kBits == 8) {
      out[2 * i] = _mm512_unpacklo_epi8(a, b);
      out[2 * i + 1] = _mm512_unpackhi_epi8(a, b);
    } else if constexpr (kBits == 16) {
      out[2 * i] = _mm512_unpacklo_epi16(a, b);
      out[2 * i + 1] = _mm512_unpackhi_epi16(a, b);
    } else if constexpr (kBits == 32) {
      out[2 * i] = _mm512_unpacklo_epi32(a, b);
      out[2 * i + 1] = _mm512_unpackhi_epi32(a, b);
    } else {
      out[2 * i] = _mm512_unpacklo_epi64(a, b);
      out[2 * i + 1] = _mm512_unpackhi_epi64(a, b);
    }
  }
}

// Transposes, within each 128-bit lane, the 16 x 16 bytes of 16 rows: out[j] holds in lane c
// byte j of lane c of every row, rows in order (four interleave stages, 64 in-lane unpacks).
GMM_TARGET_VBMI_WIDEN inline void transpose_bytes16(const __m512i (&rows)[16], __m512i (&out)[16]) {
  __m512i pairs[16], quads[16], octets[16];
  interleave_stage<8>(rows, pairs);
  interleave_stage<16>(pairs, quads);
  interleave_stage<32>(quads, octets);
  interleave_stage<64>(octets, out);
}

// Packs 64-lane fp32 B panels from an unquantized fp8 source whose contraction runs are
// contiguous ([K, N] weights read transposed, dlhs; the AVX-512F kit on CPUs with AVX512_VBMI):
// per 16 lanes and 64 contraction indices, one 64-byte load per lane, an in-lane byte transpose
// (transpose_bytes16) and widen_fp8_f32 give the 64 steps of the 16 lanes (about a quarter of the
// instructions of the generic packer's arithmetic widening and fp32 transposes, which were 6% of
// the compute-bound fp8 dlhs on Ice Lake, 2 threads).
template <DType kFp8>
GMM_TARGET_VBMI_WIDEN void pack_b_f32_fp8_runs(const PanelSource& src, std::int64_t lane0,
                                               std::int64_t lanes, std::int64_t k0, std::int64_t kc,
                                               float* out) {
  constexpr std::int64_t kWidth = 64;
  const Fp8F32Widener widener = fp8_f32_widener<kFp8>();
  const std::int64_t panel_lanes = (lanes + kWidth - 1) / kWidth * kWidth;
  const std::int64_t stride = src.lane_stride;
  const auto* data = static_cast<const std::uint8_t*>(src.data) + lane0 * stride + k0;
  for (std::int64_t lane = 0; lane < panel_lanes; lane += 16) {
    float* panel = out + (lane / kWidth) * kc * kWidth + lane % kWidth;
    const std::int64_t next_rows = std::clamp<std::int64_t>(lanes - lane - 16, 0, 16);
    for (std::int64_t k = 0; k < kc; k += 64) {
      const __mmask64 valid = first_bytes(kc - k);
      __m512i rows[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        rows[i] =
            _mm512_maskz_loadu_epi8(lane + i < lanes ? valid : 0, data + (lane + i) * stride + k);
      }
      // the next 16 lanes' lines of this block (each lane's run is a row of its own page, which
      // the hardware prefetchers do not follow)
      for (std::int64_t i = 0; i < next_rows; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(data + (lane + 16 + i) * stride + k),
                     _MM_HINT_T0);
      }
      __m512i steps[16];  // steps[j], lane c: the 16 lanes' codes of contraction k + 16c + j
      transpose_bytes16(rows, steps);
      for (int j = 0; j < 16; ++j) {
        __m512 values[4];
        widen_fp8_f32(steps[j], widener, values);
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) {
          const std::int64_t step = k + 16 * v + j;
          if (step < kc) _mm512_storeu_ps(panel + step * kWidth, values[v]);
        }
      }
    }
  }
}

// The fp8 packers of the AVX-512F kit (64-lane panels) for one fp8 type: true when the source's
// layout is one they take.
template <DType kFp8>
bool pack_b_f32_fp8(const PanelSource& src, std::int64_t lane0, std::int64_t lanes, std::int64_t k0,
                    std::int64_t kc, float* out) {
  if (src.lane_stride == 1) {
    pack_b_f32_fp8_lanes<kFp8>(src, lane0, lanes, k0, kc, out);
    return true;
  }
  if (src.k_stride == 1) {
    pack_b_f32_fp8_runs<kFp8>(src, lane0, lanes, k0, kc, out);
    return true;
  }
  return false;
}

// The B packer of the AVX-512F kit: on CPUs with AVX512_VBMI, unquantized fp8 with contiguous
// lanes or contraction runs goes to pack_b_f32_fp8_lanes or pack_b_f32_fp8_runs; everything else
// to the generic AVX-512 packer. The panels are the same bits either way.
inline void pack_b_f32(const PanelSource& src, int width, std::int64_t lane0, std::int64_t lanes,
                       std::int64_t k0, std::int64_t kc, const float* lane_scales, void* out) {
  if (cpu_features().avx512vbmi && !src.quantize && width == 64) {
    auto* panels = static_cast<float*>(out);
    if (src.dtype == DType::float8_e4m3fn &&
        pack_b_f32_fp8<DType::float8_e4m3fn>(src, lane0, lanes, k0, kc, panels)) {
      return;
    }
    if (src.dtype == DType::float8_e5m2 &&
        pack_b_f32_fp8<DType::float8_e5m2>(src, lane0, lanes, k0, kc, panels)) {
      return;
    }
  }
  pack_avx512<PackedElement::f32, PanelOrder::step_major>(src, width, lane0, lanes, k0, kc,
                                                          lane_scales, out);
}

// The sources the pair packers take straight to bf16 pairs: fp8 (widened by the tables) and bf16.
template <DType kDtype>
struct PairSource {
  static_assert(kDtype == DType::bf16 || kDtype == DType::float8_e4m3fn ||
                kDtype == DType::float8_e5m2);
  static constexpr bool fp8 = kDtype != DType::bf16;
  static constexpr std::int64_t bytes = fp8 ? 1 : 2;
};

// Indices of one vpermt2b that byte-interleaves two 32-byte runs x (bytes 0..31 of the first
// source) and y (bytes 0..31 of the second, indices 64..95) in unpack_order: byte q of the
// interleaved pairs (run q % 2, lane q / 2) goes where unpack_order puts byte q, so lookup_bf16
// emits the bf16 pairs of lanes 0..15, then 16..31. (One two-source permute where an insert and
// a vpermb took two shuffles: the packer is shuffle-bound, and dsv3-up's fp8 forward spends
// most of its time in it.)
struct Fp8PairZip {
  alignas(64) std::uint8_t order[64];
  Fp8PairZip() {
    for (int pos = 0; pos < 64; ++pos) {
      const int q = unpack_order(pos);
      order[pos] = static_cast<std::uint8_t>((q % 2) * 64 + q / 2);
    }
  }
};

// Indices of one vpermb that takes 16 columns of four contraction rows (row r's codes at bytes
// 16r .. 16r + 15) to unpack_order, so lookup_bf16 emits the bf16 pairs of the 16 columns in
// order for rows 0 and 1 (first), then for rows 2 and 3 (second).
struct Fp8QuadZip {
  alignas(64) std::uint8_t order[64];
  Fp8QuadZip() {
    for (int pos = 0; pos < 64; ++pos) {
      const int q = unpack_order(pos);  // word q % 32 of output q / 32: column (q % 32) / 2
      const int row = 2 * (q / 32) + q % 2;
      order[pos] = static_cast<std::uint8_t>(16 * row + (q % 32) / 2);
    }
  }
};

// How far ahead of its reads pack_b_pairs_lanes prefetches an fp8 source of whole rows.
constexpr std::int64_t kPackAheadBytes = 32 * 1024;

// Prefetches (into L2) the rows of a chunk of whole contraction rows (a [K, N] matrix's rows
// [k0, depth), contiguous), kPackAheadBytes ahead of the packer's reads, a line for every line's
// worth of source the packer reports read: the memory sees one unbroken stream, which the
// hardware prefetchers follow too. dsv3-up's fp8 forward (16-row groups take all 1024 columns,
// so a chunk is whole rows), scratch, 2 threads: the packer alone, 256 experts, 140 -> 95 ms
// against prefetching each block's next 16 rows in one burst (which keeps no more lines in
// flight than L1 has fill buffers); gmm_bench's fwd/v2/fp8/dsv3-up with Fp8PairZip's single
// permute, 22.5-22.8 -> 20.5-21.0 ms. (fp8 only: with the same stream, bf16 weights ran 0.90x
// to 0.98x as fast.)
class WholeRowsPrefetcher {
 public:
  // Rows of `src` from k0 on, up to src.depth or the chunk's end k0 + kc if later.
  WholeRowsPrefetcher(const PanelSource& src, std::int64_t k0, std::int64_t kc)
      : data_(static_cast<const char*>(src.data)),
        next_(k0 * src.k_stride + kPackAheadBytes),
        end_(std::max(k0 + kc, src.depth) * src.k_stride) {}

  // Counts `bytes` of source read and prefetches as many lines as that makes whole.
  void read(std::int64_t bytes) {
    for (unprefetched_ += bytes; unprefetched_ >= kCacheLineBytes && next_ < end_;
         unprefetched_ -= kCacheLineBytes, next_ += kCacheLineBytes) {
      prefetch_line_l2(data_ + next_);
    }
  }

 private:
  const char* data_;
  std::int64_t next_, end_;  // byte offsets in the source
  std::int64_t unprefetched_ = 0;
};

// Indices of the two vpermt2w that interleave the words of two rows x, y of 32 bf16 values into
// the pairs of lanes 0..15 (first) and 16..31 (second).
struct Bf16PairZip {
  alignas(64) std::uint16_t first[32], second[32];
  Bf16PairZip() {
    for (int i = 0; i < 16; ++i) {
      first[2 * i] = static_cast<std::uint16_t>(i);
      first[2 * i + 1] = static_cast<std::uint16_t>(32 + i);
      second[2 * i] = static_cast<std::uint16_t>(16 + i);
      second[2 * i + 1] = static_cast<std::uint16_t>(48 + i);
    }
  }
};

// Packs 32-lane B panels of bf16 pairs from an unquantized fp8 or bf16 source whose lanes are
// contiguous ([K, N] weights), without a round trip through fp32: per pair of contraction rows
// and panel, fp8 runs are byte-interleaved (vpermb) and widened by the table lookups, bf16 runs
// word-interleaved (two vpermt2w). Steps are padded to a multiple of kStepMultiple with zeros.
template <DType kDtype, int kStepMultiple>
GMM_TARGET_AVX512VBMI void pack_b_pairs_lanes(const PanelSource& src, std::int64_t lane0,
                                              std::int64_t lanes, std::int64_t k0, std::int64_t kc,
                                              std::uint16_t* out) {
  constexpr bool kFp8 = PairSource<kDtype>::fp8;
  constexpr std::int64_t kElement = PairSource<kDtype>::bytes;
  static const Fp8PairZip fp8_zip;
  static const Bf16PairZip bf16_zip;
  Fp8Widener widener{};
  __m512i zip0, zip1;
  if constexpr (kFp8) {
    widener = fp8_widener<kDtype>();
    zip0 = _mm512_load_si512(fp8_zip.order);
    zip1 = zip0;
  } else {
    zip0 = _mm512_load_si512(bf16_zip.first);
    zip1 = _mm512_load_si512(bf16_zip.second);
  }
  const std::int64_t steps = ((kc + 1) / 2 + kStepMultiple - 1) / kStepMultiple * kStepMultiple;
  const std::int64_t panels = (lanes + 31) / 32;
  const auto* data = static_cast<const unsigned char*>(src.data);
  // fp8 rows whole (lane0 = 0, lanes = the row): the stream of WholeRowsPrefetcher; otherwise
  // each panel's start prefetches its lines of the next block's rows.
  const bool whole_rows = kFp8 && lane0 == 0 && lanes == src.k_stride;
  WholeRowsPrefetcher ahead(src, k0, whole_rows ? kc : 0);
  // Steps are taken in blocks of kPackStepBlock and panel after panel within a block: each
  // panel's stores stay sequential (the panels of one step lie a whole panel apart, which would
  // put all of a step's stores in one L1 set), and the block's source rows stay in L1.
  for (std::int64_t s0 = 0; s0 < steps; s0 += kPackStepBlock) {
    const std::int64_t s1 = std::min(steps, s0 + kPackStepBlock);
    // the next block's rows, past the chunk's end too (up to the source's depth): the next chunk
    // of a task packs the same lanes of the rows after it, and its first block came from memory
    // unprefetched (a few rows over Mixtral's bf16 weights, 2 groups of 8 rows, blocks of 4096
    // columns and chunks of 64 on the AMX kit, 2 threads: 23.6-25.9 -> 18.9-19.3 ms; fp8 level)
    const std::int64_t ahead0 = k0 + 2 * (s0 + kPackStepBlock);
    const std::int64_t ahead1 = std::min(std::max(k0 + kc, src.depth), ahead0 + 2 * kPackStepBlock);
    for (std::int64_t p = 0; p < panels; ++p) {
      const __mmask32 live = first_words(lanes - 32 * p);
      if (!whole_rows && (32 * p * kElement) % 64 == 0) {  // the lines this panel starts
        for (std::int64_t row = ahead0; row < ahead1; ++row) {
          _mm_prefetch(reinterpret_cast<const char*>(data) +
                           (row * src.k_stride + lane0 + 32 * p) * kElement,
                       _MM_HINT_T0);
        }
      }
      for (std::int64_t s = s0; s < s1; ++s) {
        if (whole_rows) ahead.read(2 * 32);
        const unsigned char* x = data + ((k0 + 2 * s) * src.k_stride + lane0) * kElement;
        const unsigned char* y = x + src.k_stride * kElement;
        const __mmask32 x_live = 2 * s < kc ? live : 0, y_live = 2 * s + 1 < kc ? live : 0;
        std::uint16_t* dst = out + (p * steps + s) * 64;
        if constexpr (kFp8) {
          const __m512i xs = _mm512_castsi256_si512(_mm256_maskz_loadu_epi8(x_live, x + 32 * p));
          const __m512i ys = _mm512_castsi256_si512(_mm256_maskz_loadu_epi8(y_live, y + 32 * p));
          const __m512i codes = _mm512_permutex2var_epi8(xs, zip0, ys);
          __m512i first, second;
          lookup_bf16(codes, widener, first, second);
          _mm512_storeu_si512(dst, first);
          _mm512_storeu_si512(dst + 32, second);
        } else {
          const __m512i xs = _mm512_maskz_loadu_epi16(x_live, x + 64 * p);
          const __m512i ys = _mm512_maskz_loadu_epi16(y_live, y + 64 * p);
          _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(xs, zip0, ys));
          _mm512_storeu_si512(dst + 32, _mm512_permutex2var_epi16(xs, zip1, ys));
        }
      }
    }
  }
}

// vpermt2b indices of the three stages of fp8_runs_to_codes: a 16 x 16 transpose of the byte
// pairs (2 contraction indices) of 16 lanes' 32-index runs, two runs per register, in stages
// that each take two registers to two; the last one leaves each pair of steps in unpack_order.
struct Fp8RunTranspose {
  // stage 1, half h: rows 4g .. 4g + 3 (from rows 4g, 4g + 1 and 4g + 2, 4g + 3), steps
  // 8h .. 8h + 7, a row's 16 bytes after another's
  alignas(64) std::uint8_t rows4[2][64];
  // stage 2, quarter q: rows 8g .. 8g + 7 (two of stage 1's), steps 4q .. 4q + 3 of its half
  alignas(64) std::uint8_t rows8[2][64];
  // stage 3, pair o: all 16 rows (two of stage 2's), steps 2o, 2o + 1 of its quarter, as the
  // 64 codes (step, lane, index of the pair) in unpack_order
  alignas(64) std::uint8_t rows16[2][64];
  Fp8RunTranspose() {
    for (int x = 0; x < 2; ++x) {
      for (int p = 0; p < 64; ++p) {
        const int row4 = p / 16, byte4 = 16 * x + p % 16;
        rows4[x][p] = static_cast<std::uint8_t>((row4 / 2) * 64 + (row4 % 2) * 32 + byte4);
        const int row8 = p / 8, byte8 = 8 * x + p % 8;
        rows8[x][p] = static_cast<std::uint8_t>((row8 / 4) * 64 + (row8 % 4) * 16 + byte8);
        const int l = unpack_order(p);  // byte l of (step, lane, index of the pair)
        const int lane = (l % 32) / 2, byte16 = 2 * (2 * x + l / 32) + l % 2;
        rows16[x][p] = static_cast<std::uint8_t>((lane / 8) * 64 + (lane % 8) * 8 + byte16);
      }
    }
  }
};

// The fp8 codes of 16 lanes' contraction runs of 32 (rows[i]: lanes 2i and 2i + 1, 32 bytes
// each) as 8 registers of lookup_bf16 codes: codes[4h + 2q + o] holds steps 8h + 4q + 2o and
// the next one: 24 two-source byte permutes, where widening each run first and then transposing
// the bf16 pairs took 8 inserts, 8 vpermb and 64 shuffles.
GMM_TARGET_AVX512VBMI inline void fp8_runs_to_codes(const __m512i (&rows)[8],
                                                    const Fp8RunTranspose& t, __m512i (&codes)[8]) {
  __m512i four[8], eight[8];
  for (int g = 0; g < 4; ++g) {
    for (int h = 0; h < 2; ++h) {
      four[2 * g + h] =
          _mm512_permutex2var_epi8(rows[2 * g], _mm512_load_si512(t.rows4[h]), rows[2 * g + 1]);
    }
  }
  for (int g = 0; g < 2; ++g) {
    for (int h = 0; h < 2; ++h) {
      for (int q = 0; q < 2; ++q) {
        eight[4 * g + 2 * h + q] = _mm512_permutex2var_epi8(
            four[4 * g + h], _mm512_load_si512(t.rows8[q]), four[4 * g + 2 + h]);
      }
    }
  }
  for (int hq = 0; hq < 4; ++hq) {
    for (int o = 0; o < 2; ++o) {
      codes[2 * hq + o] =
          _mm512_permutex2var_epi8(eight[hq], _mm512_load_si512(t.rows16[o]), eight[4 + hq]);
    }
  }
}

// Packs B panels of bf16 pairs from an unquantized fp8 or bf16 source whose contraction runs are
// contiguous ([K, N] weights read transposed, dlhs), per 16 lanes and 32 contraction indices:
// fp8 runs are transposed as codes (fp8_runs_to_codes) and widened by the table lookups, two
// steps at a time; bf16 runs are loaded one vector of 16 pairs per lane, and a 16 x 16 transpose
// of 32-bit pairs turns them into 16 steps. Steps are padded to a multiple of kStepMultiple with
// zeros; width is a multiple of 16. Widening fp8 runs before a transpose of 32-bit pairs took
// twice the shuffles: dlhs fp8, groups of 16 rows, K = 2048, N = 1408, 1 thread, ms (medians):
// 5.64-6.15 -> 5.00-5.37; 2 threads, groups of 32 rows, 3.62-3.65 -> 3.09-3.42.
template <DType kDtype, int kStepMultiple>
GMM_TARGET_AVX512VBMI void pack_b_pairs_runs(const PanelSource& src, int width, std::int64_t lane0,
                                             std::int64_t lanes, std::int64_t k0, std::int64_t kc,
                                             std::uint16_t* out) {
  constexpr std::int64_t kElement = PairSource<kDtype>::bytes;
  const std::int64_t steps = ((kc + 1) / 2 + kStepMultiple - 1) / kStepMultiple * kStepMultiple;
  const std::int64_t panels = (lanes + width - 1) / width;
  const auto* data = static_cast<const unsigned char*>(src.data);
  for (std::int64_t lane = 0; lane < panels * width; lane += 16) {
    std::uint16_t* panel = out + (lane / width) * steps * width * 2 + (lane % width) * 2;
    for (std::int64_t k = 0; k < 2 * steps; k += 32) {
      const __mmask32 valid = first_words(kc - k);
      const std::int64_t count = std::min<std::int64_t>(16, steps - k / 2);
      if constexpr (PairSource<kDtype>::fp8) {
        static const Fp8RunTranspose transpose;
        const Fp8Widener widener = fp8_widener<kDtype>();
        __m512i rows[8], codes[8];
#pragma GCC unroll 8
        for (int i = 0; i < 16; i += 2) {
          const unsigned char* x = data + (lane0 + lane + i) * src.lane_stride + k0 + k;
          const unsigned char* y = x + src.lane_stride;
          const __mmask32 x_valid = lane + i < lanes ? valid : 0;
          const __mmask32 y_valid = lane + i + 1 < lanes ? valid : 0;
          if (x_valid) _mm_prefetch(reinterpret_cast<const char*>(x + 256), _MM_HINT_T0);
          if (y_valid) _mm_prefetch(reinterpret_cast<const char*>(y + 256), _MM_HINT_T0);
          rows[i / 2] =
              _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_maskz_loadu_epi8(x_valid, x)),
                                 _mm256_maskz_loadu_epi8(y_valid, y), 1);
        }
        fp8_runs_to_codes(rows, transpose, codes);
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) {
          __m512i first, second;
          lookup_bf16(codes[c], widener, first, second);
          const std::int64_t step = (c / 4) * 8 + ((c / 2) % 2) * 4 + (c % 2) * 2;
          if (step < count) _mm512_storeu_si512(panel + (k / 2 + step) * width * 2, first);
          if (step + 1 < count) {
            _mm512_storeu_si512(panel + (k / 2 + step + 1) * width * 2, second);
          }
        }
      } else {
        __m512 r[16];
#pragma GCC unroll 8
        for (int i = 0; i < 16; i += 2) {
          const unsigned char* x =
              data + ((lane0 + lane + i) * src.lane_stride + k0 + k) * kElement;
          const unsigned char* y = x + src.lane_stride * kElement;
          const __mmask32 x_valid = lane + i < lanes ? valid : 0;
          const __mmask32 y_valid = lane + i + 1 < lanes ? valid : 0;
          if (x_valid) _mm_prefetch(reinterpret_cast<const char*>(x + 256 * kElement), _MM_HINT_T0);
          if (y_valid) _mm_prefetch(reinterpret_cast<const char*>(y + 256 * kElement), _MM_HINT_T0);
          r[i] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(x_valid, x));
          r[i + 1] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(y_valid, y));
        }
        transpose16(r);  // r[j]: the pairs of step k / 2 + j over the 16 lanes
        for (std::int64_t j = 0; j < count; ++j) {
          _mm512_storeu_ps(panel + (k / 2 + j) * width * 2, r[j]);
        }
      }
    }
  }
}

// Packs with pack_b_pairs_runs (contiguous contraction runs, width a multiple of 16) or
// pack_b_pairs_lanes (contiguous lanes, 32-lane panels); false when the layout is neither.
template <DType kDtype, int kStepMultiple>
bool pack_b_pairs(const PanelSource& src, int width, std::int64_t lane0, std::int64_t lanes,
                  std::int64_t k0, std::int64_t kc, std::uint16_t* out) {
  if (src.k_stride == 1 && width % 16 == 0) {
    pack_b_pairs_runs<kDtype, kStepMultiple>(src, width, lane0, lanes, k0, kc, out);
    return true;
  }
  if (src.lane_stride == 1 && width == 32) {
    pack_b_pairs_lanes<kDtype, kStepMultiple>(src, lane0, lanes, k0, kc, out);
    return true;
  }
  return false;
}

// The B packer of the bf16-pair kits (AVX512_BF16, AMX): where the CPU has AVX512_VBMI,
// unquantized fp8 and bf16 sources go to pack_b_pairs; everything else to the generic AVX-512
// packer. The panels are the same bits either way.
template <int kStepMultiple>
void pack_b_bf16_pairs(const PanelSource& src, int width, std::int64_t lane0, std::int64_t lanes,
                       std::int64_t k0, std::int64_t kc, const float* lane_scales, void* out) {
  if (cpu_features().avx512vbmi && !src.quantize) {
    auto* pairs = static_cast<std::uint16_t*>(out);
    bool packed = false;
    switch (src.dtype) {
      case DType::bf16:
        packed = pack_b_pairs<DType::bf16, kStepMultiple>(src, width, lane0, lanes, k0, kc, pairs);
        break;
      case DType::float8_e4m3fn:
        packed = pack_b_pairs<DType::float8_e4m3fn, kStepMultiple>(src, width, lane0, lanes, k0, kc,
                                                                   pairs);
        break;
      case DType::float8_e5m2:
        packed = pack_b_pairs<DType::float8_e5m2, kStepMultiple>(src, width, lane0, lanes, k0, kc,
                                                                 pairs);
        break;
      default:
        break;
    }
    if (packed) return;
  }
  pack_avx512<PackedElement::bf16, PanelOrder::step_major, kStepMultiple>(src, width, lane0, lanes,
                                                                          k0, kc, lane_scales, out);
}

}  // namespace gmm::kernels

GMM_KERNELS_RESTORE_WARNINGS
#endif
