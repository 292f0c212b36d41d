// Intel AMX path: a 32 x 32 micro-kernel on bf16 tile dot products (tdpbf16ps), fed by the
// AVX-512 packers with panels padded to whole tiles.
#pragma once

#include <cstdint>

#include "gmm/kernels/avx512.hpp"
#include "gmm/kernels/cpu.hpp"
#include "gmm/kernels/format.hpp"
#include "gmm/kernels/fp8_avx512.hpp"
#include "gmm/kernels/stream_avx512.hpp"

#if GMM_KERNELS_X86
#define GMM_TARGET_AMX \
  __attribute__((      \
      target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx512bf16,fma,amx-tile,amx-bf16")))

GMM_KERNELS_SILENCE_UNDEFINED_WARNINGS

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

// The (16 * kRowTiles) x 32 product of one A panel and one B panel over `steps` packed steps into
// `tile` (row i at tile + 32 * i): C tiles 0..3 (row tile r, column half h is tile 2r + h), A tiles
// 4, 5 and B tiles 6, 7, one 32-index block of the contraction per iteration; runs between
// amx_begin and amx_end. Products of bf16 are exact; bf16 subnormals read as zero.
template <int kRowTiles>
GMM_TARGET_AMX __attribute__((always_inline)) inline void amx_tile_product(std::int64_t steps,
                                                                           const void* a_packed,
                                                                           const void* b_packed,
                                                                           float* tile) {
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
  _tile_stored(0, tile, 128);
  _tile_stored(1, tile + 16, 128);
  if (kRowTiles == 2) {
    _tile_stored(2, tile + 16 * 32, 128);
    _tile_stored(3, tile + 16 * 32 + 16, 128);
  }
}

// MicroKernelFn of the AMX kit: a (16 * kRowTiles) x 32 tile product, epilogue into C.
template <int kRowTiles>
GMM_TARGET_AMX void kernel_amx_bf16(std::int64_t steps, const void* a_packed, const void* b_packed,
                                    float* c, std::int64_t ldc, const float* row_scales,
                                    const float* col_scales, bool first, int rows) {
  alignas(64) float tile[32 * 32];
  amx_tile_product<kRowTiles>(steps, a_packed, b_packed, tile);
  const __m512 cs[2] = {_mm512_loadu_ps(col_scales), _mm512_loadu_ps(col_scales + 16)};
  for (int i = 0; i < rows; ++i) {
    const __m512 acc[2] = {_mm512_load_ps(tile + 32 * i), _mm512_load_ps(tile + 32 * i + 16)};
    store_row_avx512<2>(c + i * ldc, acc, row_scales[i], cs, first);
  }
}

// OutputKernelFn of the AMX kit: 32 x 32 tile products whose rows are scaled, rounded (bf16 by
// vcvtne2ps2bf16, as the kit's store_row rounds them) and stored past the caches, a row of a tile
// being one cache line of bf16 or two of f32. Four tiles are computed before any is stored, and
// each row's four runs then go out one after another: storing tile after tile sent each row's
// lines to memory far apart. Scratch fp8 drhs, 2 threads (bf16 gradient, 128-column blocks):
// decode 14.1-15.4 -> 10.6-11.6 ms, dsv3-up (32 experts) 26.4-28.5 -> 21.2-22.8 ms; eight tiles
// at a time did no better.
GMM_TARGET_AMX inline void output_kernel_amx_bf16(std::int64_t steps, const void* a_packed,
                                                  const void* b_packed, std::size_t b_panel_bytes,
                                                  std::int64_t tiles, void* out,
                                                  std::int64_t out_row_stride, DType dtype,
                                                  const float* row_scales, const float* col_scales,
                                                  int rows) {
  const std::int64_t row_bytes = out_row_stride * static_cast<std::int64_t>(size_of(dtype));
  const std::size_t tile_bytes = 32 * size_of(dtype);
  constexpr std::int64_t kGroup = 4;
  alignas(64) float tile[kGroup][32 * 32];
  for (std::int64_t t0 = 0; t0 < tiles; t0 += kGroup) {
    const std::int64_t group = std::min(kGroup, tiles - t0);
    for (std::int64_t j = 0; j < group; ++j) {
      amx_tile_product<2>(steps, a_packed,
                          static_cast<const unsigned char*>(b_packed) + (t0 + j) * b_panel_bytes,
                          tile[j]);
    }
    __m512 cs[kGroup][2];
    for (std::int64_t j = 0; j < group; ++j) {
      cs[j][0] = _mm512_loadu_ps(col_scales + 32 * (t0 + j));
      cs[j][1] = _mm512_loadu_ps(col_scales + 32 * (t0 + j) + 16);
    }
    for (int i = 0; i < rows; ++i) {
      const __m512 rs = _mm512_set1_ps(row_scales[i]);
      for (std::int64_t j = 0; j < group; ++j) {
        const std::int64_t t = t0 + j;
        const __m512 acc[2] = {_mm512_load_ps(tile[j] + 32 * i),
                               _mm512_load_ps(tile[j] + 32 * i + 16)};
        __m512 lo, hi;
        scaled_pair<2>(acc, rs, cs[j], 0, lo, hi);
        stream_out_pair_avx512bf16(
            static_cast<unsigned char*>(out) + t * tile_bytes + i * row_bytes, dtype, lo, hi);
      }
    }
  }
}

// KernelKit::stream_rows of the AMX kit. Past it, packing B for the 16-row tile kernel costs less
// than widening B in the streaming kernel. Scratch, 2 threads, ms, streamed against packed:
// - [K, N] weights, read a contraction row at a time: three rows of fp8 (64 groups, K = 2048, N
//   = 1408: 2 rows 10.9-12.2 against 12.7-13.4, 3 rows 11.8-12.4 against 12.4-12.9, 4 rows
//   14.2-15.6 against 13.2-13.8; 8 groups, K = N = 4096: 2 rows 7.6 against 9.3, 4 rows 10.8
//   against 9.9); one row of bf16 (64 groups: 2 rows 20.2 against 16.9, 4 rows 25.0-26.2 against
//   17.7-18.2; 8 groups, 4 rows 15.1 against 13.6).
// - Transposed weights, read in runs along the contraction: four rows over runs of at least
//   2048 (8 groups, runs of 4096: fp8 2 rows 7.3 against 11.8, 4 rows 9.7 against 11.6; bf16 10.3
//   against 13.0, 11.2 against 13.1; 16 groups, runs of 2048 and 2880, 3 rows: level), one over
//   shorter runs (64 groups, runs of 1408: fp8 2 rows 19.1 against 17.6, 4 rows 21.4-21.9
//   against 17.0-17.8, bf16 4 rows 24.8-25.3 against 18.7-19.4; 32 groups, runs of 1024, 3 rows:
//   fp8 27.3 against 23.9, bf16 30.0 against 26.2).
inline int amx_stream_rows(const PanelSource& b) {
  constexpr std::int64_t kLongRuns = 2048;
  if (b.k_stride == 1) return b.depth >= kLongRuns ? 4 : 1;
  return size_of(b.dtype) == 1 ? 3 : 1;
}

// The AMX path for operands exact in bf16: bf16 pairs padded to 16-step tiles, 32 x 32 kernel.
// Tasks of 512 rows (each B block packed for twice the rows of 256) and a contraction chunk of
// 256 (a 32 x 256 A panel and a B panel, 16 KiB each, stay in a 48 KiB L1 together; with 512
// they did not). On a Sapphire Rapids-class VM, fp8 recipe, M = 1024, K = N = 4096, 1 thread,
// medians of 9 to 15 against 256 x 512 x 512: fwd 49.6-50.5 -> 42.1-44.9 ms, dlhs 46.7-47.6 ->
// 38.1-38.4, drhs 99.3 -> 74.1-80.7. gmm_bench's fp8 cells of five shapes, 2 threads, binaries
// alternated twice: geometric mean 1.03x faster (compute-bound drhs 1.25x, qwen3-30b dlhs
// 0.92x); blocks of 256 columns gave 1.05x but 0.86x on gptoss's forward, whose 64-row groups
// then pack their fp8 weights in runs of 256 bytes. tgmm with its rhs quantized in the kernel
// takes tasks of 2048 lanes (and 256 columns, or tgmm_tiles' narrower blocks for short groups):
// each task quantizes its group's rhs again, and with 512 lanes that took about a third of
// mixtral's fp8 drhs (scratch, 2 threads, groups of 240 and 272 rows: 57-59 -> 40-41 ms;
// compute-bound 36-37 -> 31-37 ms; 1024 x 256 was level on the compute-bound shape and 45-47 ms
// on mixtral's). Short groups, 2048 x 128 against 768 x 128, ms: qwen3-30b 8.1-8.5 against
// 9.1-10.1, gptoss 19.1-20.2 against 21.5-23.6, dsv3-up 27.3-29.6 against 29.8-30.5.
// Transposed weights (dlhs) of tasks with fewer rows than a block has columns are read in chunks
// of up to 2048 (runs_chunk), each lane's run whole or in long pieces, over narrower blocks.
// Scratch dlhs, 2 threads, ms, chunks of 256 (no runs_chunk) against 2048: bf16 weights,
// dsv3-down 32.0 -> 23.0-23.3, dsv3-up 38.9 -> 28.5, skewed-uniform 32.0 -> 22.6, gptoss 26.2 ->
// 18.6-18.7, mixtral 50.7 -> 42.0-42.2, qwen3-30b level (8.6-9.0 against 8.6-8.9), compute-bound
// level (its 512-row tasks keep their blocks); fp8 weights (per-channel), dsv3-down 20.0 -> 18.7,
// mixtral 40.5 -> 39.1, the others level. 512 and 1024 gave less (dsv3-down 27.5, 26.2;
// skewed-uniform 25.1 with 1024); 4096 and 8192 no more than 2048.
inline KernelKit amx_kit() {
  KernelKit kit;
  kit.isa = Isa::amx;
  kit.format = {PackedElement::bf16, 32, 32, 2, 16};
  kit.pack_a = pack_avx512<PackedElement::bf16, PanelOrder::lane_major, 16>;
  kit.pack_b = pack_b_bf16_pairs<16>;
  kit.kernel = kernel_amx_bf16<2>;
  kit.few_rows_kernel = kernel_amx_bf16<1>;
  kit.few_rows = 16;
  kit.output_kernel = output_kernel_amx_bf16;
  kit.stream = stream_avx512_bf16;
  kit.stream_rows = amx_stream_rows;
  kit.absmax = absmax_avx512;
  kit.store_row = store_row_avx512bf16_out;
  kit.store_fence = store_fence_x86;
  kit.begin = amx_begin;
  kit.end = amx_end;
  kit.tiles = {512, 256, 512};
  kit.quantized_rhs_tiles = {2048, 256, 256};
  kit.runs_chunk = 2048;
  return kit;
}

}  // namespace gmm::kernels

GMM_KERNELS_RESTORE_WARNINGS
#endif
