// Kernel family v2: tgmm (drhs, out[g] = lhs[rows_g]^T @ rhs[rows_g]) as one fused, blocked pass.
#pragma once

#include <algorithm>
#include <cstdint>

#include "gmm/core/parallel.hpp"
#include "gmm/core/problem.hpp"
#include "gmm/kernels/cpu.hpp"
#include "gmm/kernels/select.hpp"
#include "gmm/v2/driver.hpp"

namespace gmm::v2 {

namespace detail {

// Scales of a tgmm operand [M, cols] seen with lanes = its columns and contraction = M: quantized
// in the kernel ({block x 1} absmax or fixed), stored by the caller, or none.
inline SideScales tgmm_side_scales(const Matrix& x, const std::optional<QuantSpec>& quantize,
                                   std::int64_t m) {
  SideScales s;
  if (quantize) {
    if (quantize->calibration.method == Calibration::Method::fixed) {
      s.kind = SideScales::Kind::fixed;
      s.fixed = quantize->calibration.static_scale(quantize->qtype);
    } else {
      s.kind = SideScales::Kind::absmax;
      s.quant_block = quantize->block;
      s.k_extent = m;
    }
  } else if (is_quantized(x.dtype)) {
    const BlockShape& b = x.scales.block;
    s.kind = SideScales::Kind::stored;
    s.data = x.scales.data;
    s.lane_block = b.cols;
    s.lane_step = 1;
    s.k_block = b.rows;
    s.k_step = x.cols / b.cols;
  }
  return s;
}

inline Side tgmm_side(const Matrix& x, const std::optional<QuantSpec>& quantize, std::int64_t m) {
  kernels::PanelSource source{x.data,
                              x.dtype,
                              1,
                              x.row_stride,
                              quantize.has_value(),
                              quantize ? quantize->qtype : QType::float8_e4m3fn,
                              m};
  return {source, tgmm_side_scales(x, quantize, m)};
}

inline OperandTrace tgmm_operand_trace(const Matrix& x, const std::optional<QuantSpec>& quantize,
                                       std::int64_t m) {
  if (quantize) {
    const bool fixed = quantize->calibration.method == Calibration::Method::fixed;
    return {dtype_of(quantize->qtype), true,
            fixed ? BlockShape{1, m, x.cols} : BlockShape{1, quantize->block, 1}, "in kernel"};
  }
  return caller_operand_trace(x.dtype, x.scales);
}

// Lanes per tgmm task before the short-group widening below: wider bases (the bf16 kit's 512)
// made the widened C tile outgrow L2 (2048 x 128 floats, 1 MiB) and dsv3-up's drhs 10% to 20%
// slower than 192 (768 x 128).
constexpr std::int64_t kShortGroupBaseLanes = 192;

// tgmm's task blocking. Each task of tiles.m lanes of lhs re-packs (and re-quantizes) all of
// its group's rhs, which weighs more against the product the fewer rows the groups have; so
// unless Options::tiles asks otherwise, when the mean group is shorter than tiles.k, tasks take
// up to 4x the lanes (of at most kShortGroupBaseLanes) and as many times fewer columns (the
// packed lhs chunk stays within tiles.m x tiles.k). When the rhs is quantized in the kernel and
// the kit has quantized_rhs_tiles, tasks take those lanes instead, and those columns unless the
// groups are short.
inline Tiles tgmm_tiles(const Product& product, const Options& options, const GroupRows& groups,
                        bool rhs_quantized_here) {
  Tiles tiles = product.tiles;
  if (options.tiles.m > 0 || options.tiles.n > 0) return tiles;
  std::int64_t rows = 0, used = 0;
  for (std::int64_t g = 0; g < groups.count(); ++g) {
    rows += groups.size(g);
    used += groups.size(g) > 0;
  }
  const std::int64_t longest = std::max<std::int64_t>(1, groups.longest());
  const std::int64_t nr = product.kit.format.nr;
  std::int64_t factor = 1;
  while (factor < 4 && (factor * 2) * rows <= tiles.k * used && tiles.n / (factor * 2) >= 2 * nr) {
    factor *= 2;
  }
  const std::int64_t short_group_columns = round_up(tiles.n / factor, nr);
  if (rhs_quantized_here && product.kit.quantized_rhs_tiles.m > 0) {
    Tiles quantized = resolve_tiles(product.kit, product.kit.quantized_rhs_tiles);
    if (factor > 1) quantized.n = short_group_columns;
    // no more lanes than keep a task's packed lhs over its longest group within kWholeABytes
    // (packed once per task, not once per block of columns)
    const std::int64_t mr = product.kit.format.mr;
    const std::int64_t fitting =
        kWholeABytes / (longest * static_cast<std::int64_t>(product.kit.format.element_bytes())) /
        mr * mr;
    quantized.m = std::max(tiles.m, std::min(quantized.m, fitting));
    return quantized;
  }
  if (factor == 1) return tiles;
  tiles.m = round_up(std::min(tiles.m, kShortGroupBaseLanes) * factor, product.kit.format.mr);
  tiles.n = short_group_columns;
  return tiles;
}

}  // namespace detail

inline void tgmm(const TgmmProblem& p, const Options& options) {
  const kernels::KernelKit kit =
      kernels::call_kit("gmm::v2::tgmm", options.isa,
                        detail::exact_in_bf16(p.lhs.dtype, p.quantize_lhs.has_value()) &&
                            detail::exact_in_bf16(p.rhs.dtype, p.quantize_rhs.has_value()),
                        kernels::cpu_features(), p.groups.longest());
  detail::Product product = detail::make_product(kit, options, p.n, p.m_segment, p.out.dtype,
                                                 p.out.row_stride, p.accumulate);
  product.tiles = detail::tgmm_tiles(product, options, p.groups, p.quantize_rhs.has_value());

  const detail::Side lhs = detail::tgmm_side(p.lhs, p.quantize_lhs, p.m);
  const detail::Side rhs = detail::tgmm_side(p.rhs, p.quantize_rhs, p.m);
  const std::int64_t element = static_cast<std::int64_t>(size_of(p.out.dtype));
  for (std::int64_t g = 0; g < p.groups.count(); ++g) {
    auto* block = static_cast<unsigned char*>(p.out.data) + g * p.out.group_stride * element;
    // an empty group's block is exact zeros: a job with an empty contraction, so the workers
    // write it (past the caches when the output is large)
    if (p.groups.size(g) == 0 && p.accumulate) continue;
    detail::Job job;
    job.a = lhs;
    job.b = rhs;
    job.a_begin = 0;
    job.a_end = p.k;
    job.k_begin = p.groups.begin[g];
    job.k_end = p.groups.end[g];
    job.out = block;
    if (p.k > 0 && p.n > 0) product.jobs.push_back(job);
  }
  int threads_used = 1;
  const std::int64_t extra_bytes =
      detail::run_product(product, resolve_threads(options.threads), &threads_used);

  detail::trace_call(options, "tgmm", product, threads_used, extra_bytes,
                     detail::tgmm_operand_trace(p.lhs, p.quantize_lhs, p.m),
                     detail::tgmm_operand_trace(p.rhs, p.quantize_rhs, p.m));
}

}  // namespace gmm::v2
