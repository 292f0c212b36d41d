// Intel AMX path: a 32 x 32 micro-kernel on bf16 tile dot products (tdpbf16ps), fed by the
// AVX-512 packers with panels padded to whole tiles.
#pragma once

#include <cstdint>

#include "gmm/kernels/avx512.hpp"
#include "gmm/kernels/cpu.hpp"
#include "gmm/kernels/format.hpp"
#include "gmm/kernels/stream_avx512.hpp"

#if GMM_KERNELS_X86
#define GMM_TARGET_AMX \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,fma,amx-tile,amx-bf16")))

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace gmm::kernels {

// The tile palette every AMX kernel call loads: eight tiles of 16 rows x 64 bytes (C: 16 x 16
// fp32; A: 16 rows x 16 bf16 pairs; B: 16 pair rows x 16 columns).
struct alignas(64) AmxTileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// Loads the tile configuration in the calling thread (KernelKit::begin of the AMX kit).
GMM_TARGET_AMX inline void amx_begin() {
  static const AmxTileConfig config;
  _tile_loadconfig(&config);
}

// Releases the tiles (KernelKit::end), so other code in the thread never sees our state.
GMM_TARGET_AMX inline void amx_end() { _tile_release(); }

// (16 * kRowTiles) x 32 micro-tile: C tiles 0..3 (row tile r, column half h is tile 2r + h), A
// tiles 4, 5 and B tiles 6, 7, one 32-index block of the contraction per iteration; runs between
// amx_begin and amx_end. Products of bf16 are exact; bf16 subnormals read as zero.
template <int kRowTiles>
GMM_TARGET_AMX void kernel_amx_bf16(std::int64_t steps, const void* a_packed, const void* b_packed,
                                    float* c, std::int64_t ldc, const float* row_scales,
                                    const float* col_scales, bool first, int rows) {
  const auto* a = static_cast<const std::uint16_t*>(a_packed);
  const auto* b = static_cast<const std::uint16_t*>(b_packed);
  const std::int64_t a_row_bytes = steps * 4;  // lane-major A: one row's pairs
  _tile_zero(0);
  _tile_zero(1);
  if (kRowTiles == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (std::int64_t s = 0; s < steps; s += 16) {
    _tile_loadd(6, b + s * 64, 128);
    _tile_loadd(7, b + s * 64 + 32, 128);
    _tile_loadd(4, a + s * 2, a_row_bytes);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (kRowTiles == 2) {
      _tile_loadd(5, a + 16 * steps * 2 + s * 2, a_row_bytes);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  alignas(64) float tile[32 * 32];
  _tile_stored(0, tile, 128);
  _tile_stored(1, tile + 16, 128);
  if (kRowTiles == 2) {
    _tile_stored(2, tile + 16 * 32, 128);
    _tile_stored(3, tile + 16 * 32 + 16, 128);
  }
  const __m512 cs[2] = {_mm512_loadu_ps(col_scales), _mm512_loadu_ps(col_scales + 16)};
  for (int i = 0; i < rows; ++i) {
    const __m512 acc[2] = {_mm512_load_ps(tile + 32 * i), _mm512_load_ps(tile + 32 * i + 16)};
    store_row_avx512<2>(c + i * ldc, acc, row_scales[i], cs, first);
  }
}

// Packs B panels of fp8 weights whose lanes are contiguous ([K, N] weights): per pair of rows
// the two 32-byte runs are byte-interleaved (one vpermb), each byte becomes its bf16 high and
// low byte by 128-entry table lookups (vpermi2b), the sign bit is merged, and the bytes are
// zipped into bf16 pairs.
template <DType kFp8>
GMM_TARGET_AMX void pack_b_amx_fp8(const PanelSource& src, int width, std::int64_t lane0,
                                   std::int64_t lanes, std::int64_t k0, std::int64_t kc,
                                   std::uint16_t* out) {
  static const Fp8Bf16Bytes<kFp8> table;
  const __m512i high0 = _mm512_load_si512(table.high), high1 = _mm512_load_si512(table.high + 64);
  const __m512i low0 = _mm512_load_si512(table.low), low1 = _mm512_load_si512(table.low + 64);
  // position 16L + i takes interleaved byte q = 8L + i (i < 8) or 32 + 8L + i - 8, so that the
  // in-lane unpacks below emit bytes 0..31 then 32..63 in order; byte q is row q % 2, lane q / 2
  alignas(64) std::uint8_t order[64];
  for (int pos = 0; pos < 64; ++pos) {
    const int lane = pos / 16, i = pos % 16;
    const int q = i < 8 ? 8 * lane + i : 32 + 8 * lane + i - 8;
    order[pos] = static_cast<std::uint8_t>((q % 2) * 32 + q / 2);
  }
  const __m512i zip = _mm512_load_si512(order);
  const std::int64_t steps = ((kc + 1) / 2 + 15) / 16 * 16;
  const std::int64_t panels = (lanes + width - 1) / width;
  const auto* data = static_cast<const std::uint8_t*>(src.data);
  for (std::int64_t s = 0; s < steps; ++s) {
    const std::int64_t row = k0 + 2 * s;
    const std::uint8_t* row0 = data + row * src.k_stride + lane0;
    if (2 * (s + kPrefetchSteps) < kc) {
      for (std::int64_t l = 0; l < lanes; l += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(row0 + 2 * kPrefetchSteps * src.k_stride + l),
                     _MM_HINT_T0);
        _mm_prefetch(
            reinterpret_cast<const char*>(row0 + (2 * kPrefetchSteps + 1) * src.k_stride + l),
            _MM_HINT_T0);
      }
    }
    for (std::int64_t p = 0; p < panels; ++p) {
      const std::int64_t live = lanes - p * 32;
      const __mmask32 mask = live >= 32 ? static_cast<__mmask32>(0xFFFFFFFFu)
                                        : (static_cast<__mmask32>(1u) << live) - 1;
      const __m256i r0 = _mm256_maskz_loadu_epi8(2 * s < kc ? mask : 0, row0 + p * 32);
      const __m256i r1 =
          _mm256_maskz_loadu_epi8(2 * s + 1 < kc ? mask : 0, row0 + src.k_stride + p * 32);
      const __m512i codes =
          _mm512_permutexvar_epi8(zip, _mm512_inserti64x4(_mm512_castsi256_si512(r0), r1, 1));
      const __m512i high =
          _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(high0, codes, high1), codes,
                                    _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);
      const __m512i low = _mm512_permutex2var_epi8(low0, codes, low1);
      std::uint16_t* dst = out + p * steps * width * 2 + s * width * 2;
      _mm512_storeu_si512(dst, _mm512_unpacklo_epi8(low, high));
      _mm512_storeu_si512(dst + 32, _mm512_unpackhi_epi8(low, high));
    }
  }
}

// The AMX kit's B packer: the table-driven fp8 packer for [K, N] fp8 weights, the generic
// AVX-512 packer otherwise.
GMM_TARGET_AMX inline void pack_b_amx(const PanelSource& src, int width, std::int64_t lane0,
                                      std::int64_t lanes, std::int64_t k0, std::int64_t kc,
                                      const float* lane_scales, void* out) {
  if (src.lane_stride == 1 && !src.quantize && width == 32) {
    if (src.dtype == DType::float8_e4m3fn) {
      return pack_b_amx_fp8<DType::float8_e4m3fn>(src, width, lane0, lanes, k0, kc,
                                                  static_cast<std::uint16_t*>(out));
    }
    if (src.dtype == DType::float8_e5m2) {
      return pack_b_amx_fp8<DType::float8_e5m2>(src, width, lane0, lanes, k0, kc,
                                                static_cast<std::uint16_t*>(out));
    }
  }
  pack_avx512<PackedElement::bf16, PanelOrder::step_major, 16>(src, width, lane0, lanes, k0, kc,
                                                               lane_scales, out);
}

// The AMX path for operands exact in bf16: bf16 pairs padded to 16-step tiles, 32 x 32 kernel.
inline KernelKit amx_kit() {
  KernelKit kit;
  kit.isa = Isa::amx;
  kit.format = {PackedElement::bf16, 32, 32, 2, 16};
  kit.pack_a = pack_avx512<PackedElement::bf16, PanelOrder::lane_major, 16>;
  kit.pack_b = pack_b_amx;
  kit.kernel = kernel_amx_bf16<2>;
  kit.few_rows_kernel = kernel_amx_bf16<1>;
  kit.few_rows = 16;
  kit.stream = stream_avx512_bf16;
  kit.stream_rows = 4;
  kit.absmax = absmax_avx512;
  kit.store_row = store_row_avx512_out;
  kit.begin = amx_begin;
  kit.end = amx_end;
  kit.tiles = {256, 512, 512};
  return kit;
}

}  // namespace gmm::kernels

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif
