// A generated taxonomy of gmm / tgmm test cases (XNNPACK-style): extents below, at and above a
// tile, every group pattern, and dtype / quantization recipes of every granularity.
//
// Usage (see tests/v1 for complete tests):
//   for (const GroupPattern& pattern : group_patterns(tm, rng))
//     for (std::int64_t k : extents_around(tk)) for (std::int64_t n : extents_around(tn)) {
//       GmmCase c = make_gmm_case(rng, recipe, pattern, k, n, variant);
//       EXPECT_TRUE(check_gmm(c.lhs.view(), c.rhs.grouped_view(), c.sizes, c.out, c.options));
//     }
// Recipes give block extents as preferences: 0 is the whole axis, e > 0 becomes the largest
// divisor of the axis not above e (so any shape works), and a weight K block is kept a multiple
// of the activation K block. `variant` cycles output dtype, accumulate, padding (prime row
// strides) and transpose_rhs so that a loop over cases covers their combinations.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "gmm/core/options.hpp"
#include "support/operands.hpp"
#include "support/random.hpp"

namespace gmm::test {

// Extents around a tile: 1, below, equal, just above, and several tiles plus a remainder.
inline std::vector<std::int64_t> extents_around(std::int64_t tile) {
  std::vector<std::int64_t> e{1, tile - 1, tile, tile + 1, 2 * tile + 3};
  e.erase(std::remove_if(e.begin(), e.end(), [](std::int64_t x) { return x < 1; }), e.end());
  std::sort(e.begin(), e.end());
  e.erase(std::unique(e.begin(), e.end()), e.end());
  return e;
}

// How M rows are split into groups, and which of them this call holds.
struct GroupPattern {
  std::string name;
  std::int64_t m = 0;
  std::vector<std::int32_t> sizes;  // all E global groups
  std::int64_t local_groups = 1;    // G
  std::int64_t group_offset = 0;
};

// Random sizes with zeros over up to 4 tiles of rows, a random shard of them local.
inline GroupPattern random_pattern(Rng& rng, std::int64_t tm) {
  const std::int64_t experts = rng.integer(2, 7);
  const std::int64_t m = rng.integer(1, 4 * tm);
  GroupPattern p{"random sizes with zeros", m,
                 random_group_sizes(rng, experts, rng.integer(0, m), 0.3), 1, 0};
  p.local_groups = rng.integer(1, experts);
  p.group_offset = rng.integer(0, experts - p.local_groups);
  return p;
}

// A pattern of the given global sizes with `extra` rows past them.
inline GroupPattern pattern_of(std::string name, std::vector<std::int32_t> sizes,
                               std::int64_t extra_rows, std::int64_t local_groups,
                               std::int64_t group_offset) {
  std::int64_t m = extra_rows;
  for (std::int32_t s : sizes) m += s;
  return {std::move(name), m, std::move(sizes), local_groups, group_offset};
}

// Every group pattern of the issue for row tile tm: one group, empty groups, sum(sizes) < M,
// M not a multiple of tm, one-row groups, tiles shared by several groups, expert-parallel
// shards (in the middle and last), no row owned at all, and random sizes with zeros.
inline std::vector<GroupPattern> group_patterns(std::int64_t tm, Rng& rng) {
  const auto t = static_cast<std::int32_t>(tm);
  const auto at_least = [](std::int32_t floor, std::int32_t v) { return std::max(floor, v); };
  std::vector<GroupPattern> p;
  p.push_back(pattern_of("one group", {2 * t + 3}, 0, 1, 0));
  p.push_back(pattern_of("empty groups", {t + 1, 0, at_least(0, t - 1), 0, t}, 0, 5, 0));
  p.push_back(pattern_of("rows past the groups", {t / 2 + 1, t, 1}, t + 1, 3, 0));
  p.push_back(pattern_of("M not a multiple of tm", {t + 2, at_least(1, t - 1)}, 0, 2, 0));
  p.push_back(pattern_of("one-row groups", {1, t + 1, 1}, 0, 3, 0));
  p.push_back(
      pattern_of("tile shared by many groups", {1, 1, 0, 1, at_least(0, t - 1), 2}, 0, 6, 0));
  p.push_back(pattern_of("shard in the middle", {t, 1, 0, t + 1, 2, at_least(0, t - 2)}, 0, 3, 2));
  p.push_back(pattern_of("last shard", {t, t, 1, 1}, 0, 2, 2));
  p.push_back(pattern_of("no row owned", {0, 0}, t + 1, 2, 0));
  p.push_back(random_pattern(rng, tm));
  return p;
}

// The largest divisor of `dim` not above `preferred`; 0 (or dim 0) means the whole axis.
inline std::int64_t divisor_at_most(std::int64_t dim, std::int64_t preferred) {
  if (preferred <= 0 || dim <= 0) return 0;
  for (std::int64_t d = std::min(dim, preferred); d > 1; --d) {
    if (dim % d == 0) return d;
  }
  return 1;
}

// One dtype / quantization combination. Blocks are preferences (see the header comment);
// rhs_block of gmm is given for [G, K, N] weights and transposed for [G, N, K].
struct Recipe {
  std::string name;
  DType lhs = DType::f32;
  BlockShape lhs_block{0, 0, 0};
  DType rhs = DType::f32;
  BlockShape rhs_block{0, 0, 0};
  std::optional<QuantSpec> quantize_lhs, quantize_rhs;  // block: preference along the axis

  Recipe(std::string recipe_name, DType lhs_type, BlockShape lhs_blocks, DType rhs_type,
         BlockShape rhs_blocks, std::optional<QuantSpec> quantize_lhs_spec = std::nullopt,
         std::optional<QuantSpec> quantize_rhs_spec = std::nullopt)
      : name(std::move(recipe_name)),
        lhs(lhs_type),
        lhs_block(lhs_blocks),
        rhs(rhs_type),
        rhs_block(rhs_blocks),
        quantize_lhs(quantize_lhs_spec),
        quantize_rhs(quantize_rhs_spec) {}
};

// gtest prints a recipe parameter by its name (ctest listings stay readable).
inline void PrintTo(const Recipe& recipe, std::ostream* os) { *os << recipe.name; }

inline QuantSpec dynamic(QType q, std::int64_t block) { return {q, Calibration::absmax(), block}; }
inline QuantSpec fixed(QType q, float bound) { return {q, Calibration::fixed(bound), 0}; }

// gmm recipes: plain, weight-only, every activation x weight granularity, in-call quantization.
inline std::vector<Recipe> gmm_recipes() {
  using D = DType;
  using Q = QType;
  return {
      {"f32", D::f32, {}, D::f32, {}},
      {"bf16", D::bf16, {}, D::bf16, {}},
      {"bf16_x_f32", D::bf16, {}, D::f32, {}},
      {"w8a16_e4m3_per_channel", D::bf16, {}, D::float8_e4m3fn, {1, 0, 1}},
      {"f32_x_int8_blocks", D::f32, {}, D::int8, {1, 4, 4}},
      {"e4m3_per_tensor", D::float8_e4m3fn, {0, 0, 0}, D::float8_e4m3fn, {0, 0, 0}},
      {"e4m3_per_row_x_per_channel", D::float8_e4m3fn, {1, 1, 0}, D::float8_e4m3fn, {1, 0, 1}},
      {"e5m2_per_row_x_e4m3_shared_channel",
       D::float8_e5m2,
       {1, 1, 0},
       D::float8_e4m3fn,
       {0, 0, 1}},
      {"int8_per_row_x_per_channel", D::int8, {1, 1, 0}, D::int8, {1, 0, 1}},
      {"e4m3_1xbk_x_bkxbn", D::float8_e4m3fn, {1, 1, 4}, D::float8_e4m3fn, {1, 8, 4}},
      {"int8_1xbk_x_bkxbn_shared", D::int8, {1, 1, 2}, D::int8, {0, 4, 3}},
      {"e5m2_1xbk_x_per_tensor", D::float8_e5m2, {1, 1, 3}, D::float8_e5m2, {0, 0, 0}},
      {"dynamic_e4m3_1xbk_x_per_channel",
       D::bf16,
       {},
       D::float8_e4m3fn,
       {1, 0, 1},
       dynamic(Q::float8_e4m3fn, 4)},
      {"dynamic_int8_per_row_x_bkxbn", D::f32, {}, D::int8, {1, 4, 4}, dynamic(Q::int8, 0)},
      {"dynamic_e5m2_1xbk_x_e4m3_bkxbn",
       D::bf16,
       {},
       D::float8_e4m3fn,
       {1, 4, 2},
       dynamic(Q::float8_e5m2, 2)},
      {"static_e4m3_x_per_channel",
       D::f32,
       {},
       D::float8_e4m3fn,
       {1, 0, 1},
       fixed(Q::float8_e4m3fn, 3.0f)},
  };
}

// tgmm recipes: blocks run along M (the contraction); per-row scales force one-row segments.
inline std::vector<Recipe> tgmm_recipes() {
  using D = DType;
  using Q = QType;
  return {
      {"f32", D::f32, {}, D::f32, {}},
      {"bf16", D::bf16, {}, D::bf16, {}},
      {"f32_x_bf16", D::f32, {}, D::bf16, {}},
      {"e4m3_per_tensor", D::float8_e4m3fn, {0, 0, 0}, D::float8_e4m3fn, {0, 0, 0}},
      {"e4m3_x_e5m2_per_column", D::float8_e4m3fn, {1, 0, 1}, D::float8_e5m2, {1, 0, 1}},
      {"int8_m_blocks", D::int8, {1, 4, 1}, D::int8, {1, 6, 1}},
      {"e4m3_m_blocks_x_per_tensor", D::float8_e4m3fn, {1, 3, 1}, D::float8_e4m3fn, {0, 0, 0}},
      {"e5m2_per_row_x_blocks", D::float8_e5m2, {1, 1, 0}, D::float8_e5m2, {1, 4, 2}},
      {"dynamic_e4m3_x_dynamic_e5m2",
       D::bf16,
       {},
       D::f32,
       {},
       dynamic(Q::float8_e4m3fn, 4),
       dynamic(Q::float8_e5m2, 6)},
      {"static_e4m3_x_dynamic_e5m2",
       D::f32,
       {},
       D::bf16,
       {},
       fixed(Q::float8_e4m3fn, 2.5f),
       dynamic(Q::float8_e5m2, 0)},
      {"bf16_x_dynamic_int8", D::bf16, {}, D::bf16, {}, std::nullopt, dynamic(Q::int8, 3)},
  };
}

// Padding that makes a row of `cols` elements have a prime stride, at least `cols + min_pad`
// (XNNPACK-style prime strides: rows start misaligned and never at a power-of-two distance).
inline std::int64_t prime_pad(std::int64_t cols, std::int64_t min_pad) {
  const auto is_prime = [](std::int64_t x) {
    if (x < 2) return false;
    for (std::int64_t d = 2; d * d <= x; ++d) {
      if (x % d == 0) return false;
    }
    return true;
  };
  std::int64_t stride = cols + min_pad;
  while (!is_prime(stride)) ++stride;
  return stride - cols;
}

// Output dtype, accumulate, padding and transpose_rhs of one case, cycled by `variant`.
struct Variant {
  DType out = DType::f32;
  bool accumulate = false;
  bool padded = false;
  bool transpose_rhs = false;
};

inline Variant variant_of(std::int64_t v, bool transpose_rhs) {
  return {v % 2 == 0 ? DType::f32 : DType::bf16, (v / 2) % 2 == 1, (v / 4) % 2 == 0, transpose_rhs};
}

// Resolves a preferred block against [groups, rows, cols] (see divisor_at_most).
inline BlockShape preferred_block(BlockShape b, std::int64_t groups, std::int64_t rows,
                                  std::int64_t cols) {
  return {divisor_at_most(groups, b.groups), divisor_at_most(rows, b.rows),
          divisor_at_most(cols, b.cols)};
}

// A generated gmm call: operands, group sizes, options and the output's contents before it.
struct GmmCase {
  std::string name;
  OwnedMatrix lhs, rhs;
  std::vector<std::int32_t> sizes;
  Options options;
  OwnedOutput out;
};

inline GmmCase make_gmm_case(Rng& rng, const Recipe& recipe, const GroupPattern& pattern,
                             std::int64_t k, std::int64_t n, const Variant& v) {
  GmmCase c;
  const std::int64_t m = pattern.m, groups = pattern.local_groups;
  c.name = recipe.name + " / " + pattern.name + " / K=" + std::to_string(k) +
           " N=" + std::to_string(n) + (v.transpose_rhs ? " transpose_rhs" : "") +
           (v.out == DType::bf16 ? " bf16-out" : "") + (v.accumulate ? " accumulate" : "") +
           (v.padded ? " padded" : "");
  const std::int64_t lhs_pad = v.padded ? prime_pad(k, 1) : 0;
  const std::int64_t rhs_pad = v.padded ? prime_pad(v.transpose_rhs ? k : n, 2) : 0;
  BlockShape lb = preferred_block(recipe.lhs_block, 1, m, k);
  c.lhs = random_matrix(rng, recipe.lhs, m, k, lb, lhs_pad);
  BlockShape wb = preferred_block(recipe.rhs_block, groups, k, n);
  const std::int64_t lhs_k_block =
      recipe.quantize_lhs ? divisor_at_most(k, recipe.quantize_lhs->block) : lb.cols;
  if (lhs_k_block > 0 && lhs_k_block < k && wb.rows > 0 && wb.rows < k) {
    wb.rows = lhs_k_block *
              divisor_at_most(k / lhs_k_block, std::max<std::int64_t>(1, wb.rows / lhs_k_block));
  }
  c.rhs = v.transpose_rhs
              ? random_grouped(rng, recipe.rhs, groups, n, k, {wb.groups, wb.cols, wb.rows},
                               rhs_pad, v.padded ? 7 : 0)
              : random_grouped(rng, recipe.rhs, groups, k, n, wb, rhs_pad, v.padded ? 7 : 0);
  c.sizes = pattern.sizes;
  c.options.group_offset = pattern.group_offset;
  c.options.transpose_rhs = v.transpose_rhs;
  c.options.accumulate = v.accumulate;
  if (recipe.quantize_lhs) {
    c.options.quantize_lhs = *recipe.quantize_lhs;
    c.options.quantize_lhs->block = divisor_at_most(k, recipe.quantize_lhs->block);
  }
  const std::int64_t out_pad = v.padded ? prime_pad(n, 1) : 0;
  c.out = v.accumulate ? random_output(rng, v.out, 1, m, n, out_pad)
                       : make_output(v.out, 1, m, n, 777.0f, out_pad);
  return c;
}

// A generated tgmm call; the output is [G, K, N].
struct TgmmCase {
  std::string name;
  OwnedMatrix lhs, rhs;
  std::vector<std::int32_t> sizes;
  Options options;
  OwnedOutput out;
};

inline TgmmCase make_tgmm_case(Rng& rng, const Recipe& recipe, const GroupPattern& pattern,
                               std::int64_t k, std::int64_t n, const Variant& v) {
  TgmmCase c;
  const std::int64_t m = pattern.m, groups = pattern.local_groups;
  c.name = recipe.name + " / " + pattern.name + " / K=" + std::to_string(k) +
           " N=" + std::to_string(n) + (v.out == DType::bf16 ? " bf16-out" : "") +
           (v.accumulate ? " accumulate" : "") + (v.padded ? " padded" : "");
  c.lhs = random_matrix(rng, recipe.lhs, m, k, preferred_block(recipe.lhs_block, 1, m, k),
                        v.padded ? prime_pad(k, 1) : 0);
  c.rhs = random_matrix(rng, recipe.rhs, m, n, preferred_block(recipe.rhs_block, 1, m, n),
                        v.padded ? prime_pad(n, 2) : 0);
  c.sizes = pattern.sizes;
  c.options.group_offset = pattern.group_offset;
  c.options.accumulate = v.accumulate;
  if (recipe.quantize_lhs) {
    c.options.quantize_lhs = *recipe.quantize_lhs;
    c.options.quantize_lhs->block = divisor_at_most(m, recipe.quantize_lhs->block);
  }
  if (recipe.quantize_rhs) {
    c.options.quantize_rhs = *recipe.quantize_rhs;
    c.options.quantize_rhs->block = divisor_at_most(m, recipe.quantize_rhs->block);
  }
  const std::int64_t out_pad = v.padded ? prime_pad(n, 1) : 0;
  c.out = v.accumulate ? random_output(rng, v.out, groups, k, n, out_pad)
                       : make_output(v.out, groups, k, n, 777.0f, out_pad);
  return c;
}

}  // namespace gmm::test
