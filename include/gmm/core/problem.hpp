// Validation of a gmm / tgmm call and its normalized description, shared by every family.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "gmm/core/error.hpp"
#include "gmm/core/options.hpp"
#include "gmm/core/view.hpp"

namespace gmm {

// Rows [begin, end) of the lhs owned by each local group g (global expert group_offset + g).
struct GroupRows {
  std::vector<std::int64_t> begin;
  std::vector<std::int64_t> end;
  std::int64_t size(std::int64_t g) const { return end[g] - begin[g]; }
  std::int64_t count() const { return static_cast<std::int64_t>(begin.size()); }
  // Rows of the largest group (0 when there is none).
  std::int64_t longest() const {
    std::int64_t rows = 0;
    for (std::int64_t g = 0; g < count(); ++g) rows = std::max(rows, size(g));
    return rows;
  }
};

// A validated gmm call: out[r, :] = lhs[r, :] @ W_g for the rows r of local group g.
struct GmmProblem {
  Matrix lhs;
  GroupedMatrix rhs;
  OutMatrix out;
  std::int64_t m = 0, k = 0, n = 0;
  GroupRows groups;
  bool transpose_rhs = false;
  bool accumulate = false;
  std::optional<QuantSpec> quantize_lhs;  // block already resolved against K
  // Scale blocks of lhs and rhs along K (K when a side has no K-varying scale), and the K
  // segment over which products are summed before scales are applied: the smaller of the two.
  std::int64_t lhs_k_block = 0, rhs_k_block = 0, k_segment = 0;
};

// A validated tgmm call: out[g] = lhs[rows_g]^T @ rhs[rows_g], shape [G, K, N].
struct TgmmProblem {
  Matrix lhs;
  Matrix rhs;
  OutGroupedMatrix out;
  std::int64_t m = 0, k = 0, n = 0;
  GroupRows groups;
  bool accumulate = false;
  std::optional<QuantSpec> quantize_lhs, quantize_rhs;  // blocks already resolved against M
  // Scale blocks along the contracted M axis, and the row segment within which both scales are
  // constant (their gcd); group boundaries split segments further.
  std::int64_t lhs_m_block = 0, rhs_m_block = 0, m_segment = 0;
};

namespace detail {

inline GroupRows local_group_rows(const char* where, GroupSizes sizes, std::int64_t num_groups,
                                  std::int64_t group_offset, std::int64_t m) {
  require(sizes.count > 0 && (sizes.data != nullptr), where, "group_sizes",
          "a non-empty array of int32", fmt::format("{} entries", sizes.count));
  require(num_groups > 0, where, "number of local groups G", "G >= 1", num_groups);
  require(group_offset >= 0, where, "group_offset", ">= 0", group_offset);
  require(group_offset + num_groups <= sizes.count, where, "group_offset + G",
          fmt::format("<= len(group_sizes) = {}", sizes.count), group_offset + num_groups);
  GroupRows rows;
  rows.begin.resize(num_groups);
  rows.end.resize(num_groups);
  std::int64_t offset = 0;
  for (std::int64_t j = 0; j < sizes.count; ++j) {
    if (sizes[j] < 0) fail(where, fmt::format("group_sizes[{}]", j), ">= 0", sizes[j]);
    if (j >= group_offset && j < group_offset + num_groups) {
      rows.begin[j - group_offset] = offset;
      rows.end[j - group_offset] = offset + sizes[j];
    }
    offset += sizes[j];
  }
  require(offset <= m, where, "sum(group_sizes)", fmt::format("<= M = {}", m), offset);
  return rows;
}

inline void check_extent(const char* where, std::string_view what, std::int64_t extent,
                         std::int64_t expected) {
  require(extent == expected, where, what, fmt::format("{}", expected), extent);
}

inline void check_block(const char* where, std::string_view operand, std::string_view axis,
                        std::int64_t block, std::int64_t dim) {
  require(block >= 1 && (dim == 0 || dim % block == 0), where,
          fmt::format("{} scale block along {}", operand, axis),
          fmt::format("a positive divisor of {}", dim), block);
}

// Checks a quantized operand's scales (shape, finiteness) or that an unquantized one has none.
inline void check_scales(const char* where, std::string_view operand, DType dtype, const Scales& s,
                         std::int64_t groups, std::int64_t rows, std::int64_t cols) {
  if (!is_quantized(dtype)) {
    require(s.data == nullptr, where, fmt::format("{} scales", operand),
            fmt::format("none for a {} operand", dtype), "a scale array");
    return;
  }
  check_block(where, operand, "groups", s.block.groups, groups);
  check_block(where, operand, "rows", s.block.rows, rows);
  check_block(where, operand, "cols", s.block.cols, cols);
  const std::int64_t count =
      (groups / s.block.groups) * (rows / s.block.rows) * (cols / s.block.cols);
  // an empty operand (a shard that received no tokens) has no scales to point at
  require(s.data != nullptr || count == 0, where, fmt::format("{} scales", operand),
          fmt::format("an fp32 scale array for a {} operand", dtype), "none");
  for (std::int64_t i = 0; i < count; ++i) {  // the message is formatted only on failure
    if (!std::isfinite(s.data[i])) {
      fail(where, fmt::format("{} scales[{}]", operand, i), "a finite value", s.data[i]);
    }
  }
}

inline void check_matrix(const char* where, std::string_view name, const void* data,
                         std::int64_t rows, std::int64_t cols, std::int64_t row_stride) {
  require(rows >= 0 && cols >= 0, where, fmt::format("{} shape", name), "non-negative extents",
          fmt::format("[{}, {}]", rows, cols));
  require(row_stride >= cols, where, fmt::format("{} row_stride", name),
          fmt::format(">= cols = {}", cols), row_stride);
  require(data != nullptr || rows * cols == 0, where, fmt::format("{} data", name),
          "a non-null pointer", "nullptr");
}

// Options::tiles: each extent >= 0 (0 picks the family's default), for either family.
inline void check_tiles(const char* where, const Tiles& tiles) {
  for (const auto& [extent, axis] : {std::pair{tiles.m, "m"}, {tiles.k, "k"}, {tiles.n, "n"}}) {
    require(extent >= 0, where, fmt::format("options.tiles.{}", axis), ">= 0 (0 picks the default)",
            extent);
  }
}

inline void check_output_dtype(const char* where, DType d) {
  require(d == DType::f32 || d == DType::bf16, where, "out dtype", "f32 or bf16", d);
}

// Resolves a QuantSpec's block against the contraction extent and checks it.
inline QuantSpec resolve_quant_spec(const char* where, std::string_view operand, DType dtype,
                                    QuantSpec spec, std::int64_t axis_extent,
                                    std::string_view axis) {
  require(!is_quantized(dtype), where, fmt::format("quantize_{}", operand),
          "an unquantized (f32 or bf16) operand to quantize", dtype);
  if (spec.calibration.method == Calibration::Method::fixed) {
    spec.calibration.static_scale(spec.qtype);  // throws when the scale is too small
    spec.block = axis_extent;
    return spec;
  }
  require(spec.block >= 0, where, fmt::format("quantize_{}.block", operand), ">= 0", spec.block);
  if (spec.block == 0 || spec.block > axis_extent) spec.block = axis_extent;
  if (axis_extent > 0) {
    require(axis_extent % spec.block == 0, where, fmt::format("quantize_{}.block", operand),
            fmt::format("a divisor of {} = {}", axis, axis_extent), spec.block);
  }
  return spec;
}

}  // namespace detail

inline GmmProblem make_gmm_problem(const char* where, const Matrix& lhs, const GroupedMatrix& rhs,
                                   GroupSizes group_sizes, const OutMatrix& out,
                                   const Options& options) {
  using detail::require;
  GmmProblem p;
  p.lhs = lhs;
  p.rhs = rhs;
  p.out = out;
  p.m = lhs.rows;
  p.k = lhs.cols;
  p.transpose_rhs = options.transpose_rhs;
  p.accumulate = options.accumulate;
  detail::check_matrix(where, "lhs", lhs.data, lhs.rows, lhs.cols, lhs.row_stride);
  detail::check_matrix(where, "rhs", rhs.data, rhs.groups * rhs.rows, rhs.cols, rhs.row_stride);
  require(rhs.group_stride >= rhs.rows * rhs.row_stride, where, "rhs group_stride",
          fmt::format(">= rows * row_stride = {}", rhs.rows * rhs.row_stride), rhs.group_stride);
  detail::check_matrix(where, "out", out.data, out.rows, out.cols, out.row_stride);
  detail::check_output_dtype(where, out.dtype);
  detail::check_tiles(where, options.tiles);
  const std::int64_t rhs_k = options.transpose_rhs ? rhs.cols : rhs.rows;
  p.n = options.transpose_rhs ? rhs.rows : rhs.cols;
  detail::check_extent(
      where, options.transpose_rhs ? "rhs cols (K, transpose_rhs)" : "rhs rows (K)", rhs_k, p.k);
  detail::check_extent(where, "out rows (M)", out.rows, p.m);
  detail::check_extent(where, "out cols (N)", out.cols, p.n);
  require(!options.quantize_rhs, where, "quantize_rhs", "unset for gmm (weights arrive quantized)",
          "a QuantSpec");
  detail::check_scales(where, "lhs", lhs.dtype, lhs.scales, 1, lhs.rows, lhs.cols);
  detail::check_scales(where, "rhs", rhs.dtype, rhs.scales, rhs.groups, rhs.rows, rhs.cols);
  if (options.quantize_lhs) {
    p.quantize_lhs =
        detail::resolve_quant_spec(where, "lhs", lhs.dtype, *options.quantize_lhs, p.k, "K");
  }
  p.groups = detail::local_group_rows(where, group_sizes, rhs.groups, options.group_offset, p.m);

  p.lhs_k_block = p.k;
  if (p.quantize_lhs) p.lhs_k_block = p.quantize_lhs->block;
  if (is_quantized(lhs.dtype)) p.lhs_k_block = lhs.scales.block.cols;
  p.rhs_k_block = p.k;
  if (is_quantized(rhs.dtype)) {
    p.rhs_k_block = options.transpose_rhs ? rhs.scales.block.cols : rhs.scales.block.rows;
  }
  if (p.lhs_k_block < p.k && p.rhs_k_block < p.k) {
    require(p.rhs_k_block % p.lhs_k_block == 0, where, "rhs scale block along K",
            fmt::format("a multiple of the lhs K block {}", p.lhs_k_block), p.rhs_k_block);
  }
  p.k_segment = std::max<std::int64_t>(1, std::min(p.lhs_k_block, p.rhs_k_block));
  return p;
}

inline TgmmProblem make_tgmm_problem(const char* where, const Matrix& lhs, const Matrix& rhs,
                                     GroupSizes group_sizes, const OutGroupedMatrix& out,
                                     const Options& options) {
  using detail::require;
  TgmmProblem p;
  p.lhs = lhs;
  p.rhs = rhs;
  p.out = out;
  p.m = lhs.rows;
  p.k = lhs.cols;
  p.n = rhs.cols;
  p.accumulate = options.accumulate;
  detail::check_matrix(where, "lhs", lhs.data, lhs.rows, lhs.cols, lhs.row_stride);
  detail::check_matrix(where, "rhs", rhs.data, rhs.rows, rhs.cols, rhs.row_stride);
  detail::check_matrix(where, "out", out.data, out.groups * out.rows, out.cols, out.row_stride);
  require(out.group_stride >= out.rows * out.row_stride, where, "out group_stride",
          fmt::format(">= rows * row_stride = {}", out.rows * out.row_stride), out.group_stride);
  detail::check_output_dtype(where, out.dtype);
  detail::check_tiles(where, options.tiles);
  require(!options.transpose_rhs, where, "transpose_rhs", "false for tgmm", true);
  detail::check_extent(where, "rhs rows (M)", rhs.rows, p.m);
  detail::check_extent(where, "out rows (K)", out.rows, p.k);
  detail::check_extent(where, "out cols (N)", out.cols, p.n);
  detail::check_scales(where, "lhs", lhs.dtype, lhs.scales, 1, lhs.rows, lhs.cols);
  detail::check_scales(where, "rhs", rhs.dtype, rhs.scales, 1, rhs.rows, rhs.cols);
  if (options.quantize_lhs) {
    p.quantize_lhs =
        detail::resolve_quant_spec(where, "lhs", lhs.dtype, *options.quantize_lhs, p.m, "M");
  }
  if (options.quantize_rhs) {
    p.quantize_rhs =
        detail::resolve_quant_spec(where, "rhs", rhs.dtype, *options.quantize_rhs, p.m, "M");
  }
  p.groups = detail::local_group_rows(where, group_sizes, out.groups, options.group_offset, p.m);
  p.lhs_m_block = p.quantize_lhs            ? p.quantize_lhs->block
                  : is_quantized(lhs.dtype) ? lhs.scales.block.rows
                                            : p.m;
  p.rhs_m_block = p.quantize_rhs            ? p.quantize_rhs->block
                  : is_quantized(rhs.dtype) ? rhs.scales.block.rows
                                            : p.m;
  p.m_segment = std::max<std::int64_t>(1, std::gcd(p.lhs_m_block, p.rhs_m_block));
  return p;
}

}  // namespace gmm
