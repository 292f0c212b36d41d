// Kernel family v1: gmm (forward, and dlhs with transpose_rhs), Megablox-style.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gmm/core/groups.hpp"
#include "gmm/core/parallel.hpp"
#include "gmm/core/problem.hpp"
#include "gmm/core/quantize.hpp"
#include "gmm/v1/kernel.hpp"

namespace gmm::v1 {
namespace detail {

// out[r0:r1, n0:n1] of local group g: the lhs rows of the visit times W_g's columns, summed
// over K in chunks of at most tk that never straddle a scale segment (p.k_segment), each
// segment's sum multiplied by its lhs row scales and weight column scales.
inline void gmm_tile(const GmmProblem& p, std::int64_t g, std::int64_t r0, std::int64_t r1,
                     std::int64_t n0, std::int64_t n1, std::int64_t tk, bool scaled, Scratch& s) {
  const std::int64_t rows = r1 - r0, cols = n1 - n0;
  const GroupedMatrix& w = p.rhs;
  const void* w_group =
      static_cast<const unsigned char*>(w.data) + g * w.group_stride * size_of(w.dtype);
  SegmentAccumulator acc(s.acc.data(), s.partial.data(), rows, cols, scaled);
  for (std::int64_t k0 = 0; k0 < p.k; k0 += p.k_segment) {
    const std::int64_t k1 = std::min(p.k, k0 + p.k_segment);
    acc.begin_segment();
    for (std::int64_t kc = k0, kn; kc < k1; kc = kn) {
      kn = std::min(k1, (kc / tk + 1) * tk);
      const std::int64_t depth = kn - kc;
      const FloatTile a = load_tile(p.lhs.data, p.lhs.dtype, p.lhs.row_stride, r0, rows, kc, depth,
                                    s.lhs_tile.data());
      if (p.transpose_rhs) {  // W_g^T is stored [N, K]: a column-major [K, N] tile
        const FloatTile b =
            load_tile(w_group, w.dtype, w.row_stride, n0, cols, kc, depth, s.rhs_tile.data());
        s.gemm->add<Eigen::RowMajor, Eigen::ColMajor>(acc.target(), rows, cols, depth, a, b);
      } else {
        const FloatTile b =
            load_tile(w_group, w.dtype, w.row_stride, kc, depth, n0, cols, s.rhs_tile.data());
        s.gemm->add<Eigen::RowMajor, Eigen::RowMajor>(acc.target(), rows, cols, depth, a, b);
      }
    }
    if (!scaled) continue;
    for (std::int64_t r = r0; r < r1; ++r) {
      s.row_scale[r - r0] = scale_of(p.lhs.scales, p.m, p.k, 0, r, k0);
    }
    for (std::int64_t n = n0; n < n1; ++n) {
      s.col_scale[n - n0] = p.transpose_rhs ? scale_of(w.scales, w.rows, w.cols, g, n, k0)
                                            : scale_of(w.scales, w.rows, w.cols, g, k0, n);
    }
    acc.end_segment(s.row_scale.data(), s.col_scale.data());
  }
  store_tile(p.out.data, p.out.dtype, p.out.row_stride, r0 * p.out.row_stride + n0, acc.result(),
             rows, cols, p.accumulate);
}

}  // namespace detail

// Megablox's gmm on the CPU. An f32 / bf16 lhs to quantize (options.quantize_lhs) is first
// materialized by gmm::quantize (one scale per row and K block, or the static per-tensor scale
// of fixed calibration). The kernel then walks the tile grid of make_group_metadata (a row tile
// shared by several groups is visited once per group, each visit computing and storing only its
// group's rows) times the N tiles, in parallel over all (visit, N tile) pairs of all groups;
// each task decodes the fp32 tiles it needs once and multiplies them with Eigen's GEMM, scales
// applied per K segment. Rows no local group owns are zeroed by extra tasks (left untouched
// when accumulating). Every output element is computed by one task in a fixed order, so the
// result is bitwise identical for any thread count.
//
// options.isa must be Isa::automatic: v1 runs the vectorization Eigen was compiled for
// (reported in the trace) and cannot be forced to another path (gmm::Error, never a silent
// fallback). options.tiles are (tm, tk, tn), 0 picking the defaults (128, 256, 512).
inline void gmm(const GmmProblem& problem, const Options& options) {
  constexpr const char* where = "gmm::gmm (family v1)";
  const Tiles tiles = detail::resolve_options(where, options, detail::kGmmTiles);
  const int threads = resolve_threads(options.threads);
  GmmProblem p = problem;
  QArray quantized_lhs;
  if (p.quantize_lhs) {
    p.lhs = detail::materialize(p.lhs, *p.quantize_lhs, blocks::tile(1, p.quantize_lhs->block),
                                threads, quantized_lhs);
  }
  const bool scaled = is_quantized(p.lhs.dtype) || is_quantized(p.rhs.dtype);

  const GroupMetadata meta = make_group_metadata(p.groups, p.m, tiles.m, false);
  const std::int64_t tiles_n = detail::ceil_div(p.n, tiles.n);
  // Rows outside the local groups: [0, first) and [last, M), zeroed in chunks of tm rows.
  const std::int64_t first = meta.group_offsets[1], last = meta.group_offsets.back();
  const std::int64_t head_chunks = p.accumulate ? 0 : detail::ceil_div(first, tiles.m);
  const std::int64_t tail_chunks = p.accumulate ? 0 : detail::ceil_div(p.m - last, tiles.m);
  const std::int64_t tile_tasks = p.n > 0 ? meta.num_tiles * tiles_n : 0;
  const std::int64_t zero_tasks = p.n > 0 ? head_chunks + tail_chunks : 0;
  const std::int64_t tasks = tile_tasks + zero_tasks;

  const std::int64_t tm = std::min(tiles.m, p.m), tk = std::min(tiles.k, p.k);
  const std::int64_t tn = std::min(tiles.n, p.n);
  const int workers = static_cast<int>(std::clamp<std::int64_t>(tasks, 1, threads));
  std::vector<detail::Scratch> scratch = detail::make_scratch(
      workers, p.lhs.dtype != DType::f32 ? tm * tk : 0, p.rhs.dtype != DType::f32 ? tk * tn : 0, tm,
      tn, tk, scaled, p.k_segment < p.k);

  parallel_for(tasks, workers, [&](std::int64_t task, int worker) {
    if (task < tile_tasks) {
      const std::int64_t visit = task / tiles_n, n_tile = task % tiles_n;
      const std::int64_t n0 = n_tile * tiles.n, n1 = std::min(p.n, n0 + tiles.n);
      detail::gmm_tile(p, meta.group_ids[visit] - 1, meta.visit_begin(visit), meta.visit_end(visit),
                       n0, n1, tiles.k, scaled, scratch[worker]);
      return;
    }
    const std::int64_t chunk = task - tile_tasks;
    const std::int64_t r0 =
        chunk < head_chunks ? chunk * tiles.m : last + (chunk - head_chunks) * tiles.m;
    const std::int64_t r1 = std::min(chunk < head_chunks ? first : p.m, r0 + tiles.m);
    detail::store_zeros(p.out.data, p.out.dtype, p.out.row_stride, r0 * p.out.row_stride, r1 - r0,
                        p.n);
  });

  detail::fill_trace(options.trace, "gmm", tiles, threads,
                     detail::operand_trace(p.lhs.dtype, p.lhs.scales, p.quantize_lhs.has_value()),
                     detail::operand_trace(p.rhs.dtype, p.rhs.scales, false), {&quantized_lhs},
                     scratch);
}

}  // namespace gmm::v1
