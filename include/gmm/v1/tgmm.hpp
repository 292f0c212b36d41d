// Kernel family v1: tgmm (drhs), Megablox-style.
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

// out[g][k0:k1, n0:n1] = sum over the rows of group g (its visits [first, last) of the tile
// grid) of lhs[r, k0:k1]^T rhs[r, n0:n1], in row chunks that never straddle a scale segment
// (p.m_segment), each segment's sum multiplied by its lhs column scales and rhs column scales.
inline void tgmm_tile(const TgmmProblem& p, const GroupMetadata& meta, std::int64_t g,
                      std::int64_t first, std::int64_t last, std::int64_t k0, std::int64_t k1,
                      std::int64_t n0, std::int64_t n1, bool scaled, Scratch& s) {
  const std::int64_t rows = k1 - k0, cols = n1 - n0;
  const std::int64_t offset = g * p.out.group_stride + k0 * p.out.row_stride + n0;
  if (p.groups.size(g) == 0) {
    if (!p.accumulate) store_zeros(p.out.data, p.out.dtype, p.out.row_stride, offset, rows, cols);
    return;
  }
  SegmentAccumulator acc(s.acc.data(), s.partial.data(), rows, cols, scaled);
  std::int64_t segment = -1, segment_row = 0;
  const auto end_segment = [&] {
    if (!scaled || segment < 0) return;
    for (std::int64_t k = k0; k < k1; ++k) {
      s.row_scale[k - k0] = scale_of(p.lhs.scales, p.m, p.k, 0, segment_row, k);
    }
    for (std::int64_t n = n0; n < n1; ++n) {
      s.col_scale[n - n0] = scale_of(p.rhs.scales, p.m, p.n, 0, segment_row, n);
    }
    acc.end_segment(s.row_scale.data(), s.col_scale.data());
  };
  for (std::int64_t visit = first; visit < last; ++visit) {
    const std::int64_t r1 = meta.visit_end(visit);
    for (std::int64_t r = meta.visit_begin(visit), re; r < r1; r = re) {
      re = std::min(r1, (r / p.m_segment + 1) * p.m_segment);
      if (r / p.m_segment != segment) {
        end_segment();
        segment = r / p.m_segment;
        segment_row = r;
        acc.begin_segment();
      }
      const std::int64_t depth = re - r;
      const FloatTile a = load_tile(p.lhs.data, p.lhs.dtype, p.lhs.row_stride, r, depth, k0, rows,
                                    s.lhs_tile.data());
      const FloatTile b = load_tile(p.rhs.data, p.rhs.dtype, p.rhs.row_stride, r, depth, n0, cols,
                                    s.rhs_tile.data());
      // The lhs tile [rows r..re, K tile] is read transposed: column-major [K tile, depth].
      s.gemm->add<Eigen::ColMajor, Eigen::RowMajor>(acc.target(), rows, cols, depth, a, b);
    }
  }
  end_segment();
  store_tile(p.out.data, p.out.dtype, p.out.row_stride, offset, acc.result(), rows, cols,
             p.accumulate);
}

}  // namespace detail

// Megablox's tgmm on the CPU. f32 / bf16 operands to quantize (options.quantize_lhs /
// quantize_rhs) are first materialized by gmm::quantize (one scale per column and M block, or
// the static per-tensor scale of fixed calibration). Each task owns one tk x tn tile of one
// local group's output and walks that group's visits of the tile grid (make_group_metadata
// with visit_empty_groups, both operands restricted to the group's rows), decoding the fp32
// tiles it needs once and multiplying them with Eigen's GEMM, scales applied per row segment.
// Tasks cover all (group, K tile, N tile) triples of all groups in parallel; an empty group's
// tasks write zeros (nothing when accumulating). Results are bitwise identical for any thread
// count.
//
// options.isa must be Isa::automatic (see v1::gmm). options.tiles are (tm, tk, tn): tm rows
// per contraction chunk, tk x tn output tiles; 0 picks the defaults (256, 256, 256).
inline void tgmm(const TgmmProblem& problem, const Options& options) {
  constexpr const char* where = "gmm::tgmm (family v1)";
  const Tiles tiles = detail::resolve_options(where, options, detail::kTgmmTiles);
  const int threads = resolve_threads(options.threads);
  TgmmProblem p = problem;
  QArray quantized_lhs, quantized_rhs;
  if (p.quantize_lhs) {
    p.lhs = detail::materialize(p.lhs, *p.quantize_lhs, blocks::tile(p.quantize_lhs->block, 1),
                                threads, quantized_lhs);
  }
  if (p.quantize_rhs) {
    p.rhs = detail::materialize(p.rhs, *p.quantize_rhs, blocks::tile(p.quantize_rhs->block, 1),
                                threads, quantized_rhs);
  }
  const bool scaled = is_quantized(p.lhs.dtype) || is_quantized(p.rhs.dtype);

  const GroupMetadata meta = make_group_metadata(p.groups, p.m, tiles.m, true);
  const std::int64_t groups = p.groups.count();
  std::vector<std::int64_t> first_visit(static_cast<std::size_t>(groups + 1), meta.num_tiles);
  for (std::int64_t i = meta.num_tiles - 1; i >= 0; --i) first_visit[meta.group_ids[i] - 1] = i;
  for (std::int64_t g = groups - 1; g >= 0; --g) {
    first_visit[g] = std::min(first_visit[g], first_visit[g + 1]);
  }
  const std::int64_t tiles_k = detail::ceil_div(p.k, tiles.k);
  const std::int64_t tiles_n = detail::ceil_div(p.n, tiles.n);
  const std::int64_t tasks = groups * tiles_k * tiles_n;

  const std::int64_t tm = std::min(tiles.m, p.m), tk = std::min(tiles.k, p.k);
  const std::int64_t tn = std::min(tiles.n, p.n);
  const int workers = static_cast<int>(std::clamp<std::int64_t>(tasks, 1, threads));
  std::vector<detail::Scratch> scratch = detail::make_scratch(
      workers, p.lhs.dtype != DType::f32 ? tm * tk : 0, p.rhs.dtype != DType::f32 ? tm * tn : 0, tk,
      tn, tm, scaled, p.m_segment < p.m);

  parallel_for(tasks, workers, [&](std::int64_t task, int worker) {
    const std::int64_t g = task / (tiles_k * tiles_n);
    const std::int64_t k0 = (task / tiles_n % tiles_k) * tiles.k;
    const std::int64_t n0 = task % tiles_n * tiles.n;
    detail::tgmm_tile(p, meta, g, first_visit[g], first_visit[g + 1], k0,
                      std::min(p.k, k0 + tiles.k), n0, std::min(p.n, n0 + tiles.n), scaled,
                      scratch[worker]);
  });

  detail::fill_trace(options.trace, "tgmm", tiles, threads,
                     detail::operand_trace(p.lhs.dtype, p.lhs.scales, p.quantize_lhs.has_value()),
                     detail::operand_trace(p.rhs.dtype, p.rhs.scales, p.quantize_rhs.has_value()),
                     {&quantized_lhs, &quantized_rhs}, scratch);
}

}  // namespace gmm::v1
