// Shared pieces of the v2 tests: the ISA paths this CPU runs, operand recipes and case runners.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gmm/gmm.hpp"
#include "gmm/kernels/cpu.hpp"
#include "support/compare.hpp"
#include "support/operands.hpp"
#include "support/random.hpp"

namespace gmm::test::v2 {

// Every forced path this machine can run (the suite instantiates each of them).
inline std::vector<Isa> supported_isas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512f, Isa::avx512bf16, Isa::amx}) {
    if (kernels::isa_supported(isa)) isas.push_back(isa);
  }
  return isas;
}

inline std::string isa_param_name(const ::testing::TestParamInfo<Isa>& info) {
  return std::string(name(info.param));
}

// What one operand looks like: its dtype and, when quantized, its scale block (test BlockShape:
// 0 = whole extent), or an in-kernel quantization of an f32 / bf16 operand.
struct OperandRecipe {
  DType dtype = DType::bf16;
  BlockShape block{0, 0, 0};
  std::optional<QuantSpec> quantize = std::nullopt;
};

inline QuantSpec dynamic(QType q, std::int64_t block) { return {q, Calibration::absmax(), block}; }
inline QuantSpec fixed(QType q, float bound) { return {q, Calibration::fixed(bound), 0}; }

inline std::string describe(const OperandRecipe& r) {
  std::string s(name(r.dtype));
  if (is_quantized(r.dtype)) {
    s += fmt::format("[{},{},{}]", r.block.groups, r.block.rows, r.block.cols);
  }
  if (r.quantize) {
    s += fmt::format("->{}({},{})", name(r.quantize->qtype), r.quantize->calibration.to_string(),
                     r.quantize->block);
  }
  return s;
}

// The shape of a gmm / tgmm case: extents, group sizes (E global groups), the local shard and
// the task blocking (0 = the kit's defaults).
struct CaseShape {
  std::string label;
  std::int64_t m = 0, k = 0, n = 0;
  std::vector<std::int32_t> group_sizes;
  std::int64_t local_groups = 0;  // 0: all of group_sizes
  std::int64_t group_offset = 0;
  Tiles tiles = {};
  std::int64_t groups() const {
    return local_groups > 0 ? local_groups : static_cast<std::int64_t>(group_sizes.size());
  }
};

// Random group sizes summing to `rows` over `count` groups, some empty.
inline std::vector<std::int32_t> sizes_with_zeros(std::uint64_t seed, std::int64_t count,
                                                  std::int64_t rows) {
  Rng rng(seed);
  return random_group_sizes(rng, count, rows, 0.3);
}

// The shape taxonomy: K / N below, equal to and above tiles and multiples of nothing, empty
// groups, sum(gs) < M, G = 1, a one-row group, expert-parallel shards, random sizes with zeros.
inline std::vector<CaseShape> shape_taxonomy() {
  const Tiles small{16, 32, 48};
  return {
      {"one_row", 1, 7, 5, {1}},
      {"single_group", 23, 33, 29, {23}},
      {"empty_groups", 41, 31, 17, {0, 13, 0, 28, 0}},
      {"rows_past_groups", 37, 19, 23, {10, 0, 15}},
      {"shard", 50, 24, 21, {6, 9, 0, 12, 8, 15}, 3, 2},
      {"random_zeros", 67, 45, 39, sizes_with_zeros(7, 6, 67)},
      {"k_below_tile", 29, 13, 50, {11, 18}, 0, 0, small},
      {"k_equal_tile", 35, 32, 48, {20, 15}, 0, 0, small},
      {"k_above_tile", 53, 97, 101, {17, 0, 36}, 0, 0, small},
      {"prime_strides", 31, 61, 53, {13, 7, 11}, 0, 0, {8, 2, 8}},
      {"wide", 19, 130, 257, {9, 10}, 0, 0, small},
      {"k_one", 9, 1, 33, {4, 5}},
  };
}

// A thread count and ISA for a case, and the trace of the call.
inline Options make_options(Isa isa, const CaseShape& s, int threads = 2) {
  Options o;
  o.isa = isa;
  o.tiles = s.tiles;
  o.group_offset = s.group_offset;
  o.threads = threads;
  return o;
}

}  // namespace gmm::test::v2

namespace gmm::test::v2 {

// The largest divisor of x that is at most x / 2 (1 for primes): a scale block that is neither
// the whole axis nor one element, when x allows.
inline std::int64_t mid_divisor(std::int64_t x) {
  for (std::int64_t d = x / 2; d > 1; --d) {
    if (x % d == 0) return d;
  }
  return 1;
}

// Placeholders in recipe blocks, resolved against the case's extents.
constexpr std::int64_t kDivK = -1;  // mid_divisor(K) (gmm) or mid_divisor(M) (tgmm)
constexpr std::int64_t kDivN = -2;  // mid_divisor(N)

inline std::int64_t resolve_extent(std::int64_t e, std::int64_t contraction, std::int64_t n) {
  return e == kDivK ? mid_divisor(contraction) : e == kDivN ? mid_divisor(n) : e;
}

inline OperandRecipe resolve(OperandRecipe r, std::int64_t contraction, std::int64_t n) {
  r.block = {resolve_extent(r.block.groups, contraction, n),
             resolve_extent(r.block.rows, contraction, n),
             resolve_extent(r.block.cols, contraction, n)};
  if (r.quantize) r.quantize->block = resolve_extent(r.quantize->block, contraction, n);
  return r;
}

// A gmm recipe: lhs [M, K] and weights whose block is written in (G, K, N) orientation.
struct GmmRecipe {
  std::string label;
  OperandRecipe lhs, rhs;
};

inline std::vector<GmmRecipe> gmm_recipes() {
  using Q = QType;
  const OperandRecipe bf16{DType::bf16}, f32{DType::f32};
  const OperandRecipe e4_channel{DType::float8_e4m3fn, {1, 0, 1}};
  return {
      {"f32", f32, f32},
      {"bf16", bf16, bf16},
      {"bf16_x_f32", bf16, f32},
      {"f32_x_e4m3_channel", f32, e4_channel},
      {"bf16_x_e4m3_shared_channel", bf16, {DType::float8_e4m3fn, {0, 0, 1}}},
      {"bf16_x_e5m2_tensor", bf16, {DType::float8_e5m2, {0, 0, 0}}},
      {"bf16_x_int8_channel", bf16, {DType::int8, {1, 0, 1}}},
      {"dyn_e4m3_x_e4m3_channel", {DType::f32, {}, dynamic(Q::float8_e4m3fn, kDivK)}, e4_channel},
      {"dyn_e5m2_x_e4m3_blocks",
       {DType::bf16, {}, dynamic(Q::float8_e5m2, kDivK)},
       {DType::float8_e4m3fn, {1, kDivK, kDivN}}},
      {"dyn_int8_x_int8_channel", {DType::bf16, {}, dynamic(Q::int8, 0)}, {DType::int8, {1, 0, 1}}},
      {"fixed_e4m3_x_e4m3_channel", {DType::f32, {}, fixed(Q::float8_e4m3fn, 4.0f)}, e4_channel},
      {"pre_e4m3_row_x_e4m3_channel", {DType::float8_e4m3fn, {1, 1, 0}}, e4_channel},
      {"pre_e4m3_1xbk_x_e4m3_blocks",
       {DType::float8_e4m3fn, {1, 1, kDivK}},
       {DType::float8_e4m3fn, {1, kDivK, kDivN}}},
      {"pre_int8_tensor_x_bf16", {DType::int8, {0, 0, 0}}, bf16},
  };
}

// A tgmm recipe: lhs [M, K] and rhs [M, N], blocks along M written as kDivK.
struct TgmmRecipe {
  std::string label;
  OperandRecipe lhs, rhs;
};

inline std::vector<TgmmRecipe> tgmm_recipes() {
  using Q = QType;
  const OperandRecipe bf16{DType::bf16}, f32{DType::f32};
  return {
      {"f32", f32, f32},
      {"bf16", bf16, bf16},
      {"f32_x_bf16", f32, bf16},
      {"dyn_e4m3_x_dyn_e5m2",
       {DType::bf16, {}, dynamic(Q::float8_e4m3fn, kDivK)},
       {DType::bf16, {}, dynamic(Q::float8_e5m2, 0)}},
      {"fixed_e4m3_x_dyn_int8",
       {DType::f32, {}, fixed(Q::float8_e4m3fn, 3.0f)},
       {DType::f32, {}, dynamic(Q::int8, kDivK)}},
      {"pre_e4m3_x_pre_e5m2",
       {DType::float8_e4m3fn, {1, kDivK, 1}},
       {DType::float8_e5m2, {1, kDivK, 1}}},
      {"pre_e4m3_tensor_x_bf16", {DType::float8_e4m3fn, {0, 0, 0}}, bf16},
      {"dyn_e4m3_x_pre_e4m3",
       {DType::bf16, {}, dynamic(Q::float8_e4m3fn, 0)},
       {DType::float8_e4m3fn, {1, kDivK, 1}}},
  };
}

// The operands, options and output of a gmm case, before the call.
struct GmmCase {
  OwnedMatrix lhs, rhs;
  Options options;
  OwnedOutput before;

  // gmm::gmm on a copy of `before`, unchecked (for comparing runs bit for bit).
  OwnedOutput run(GroupSizes sizes) const {
    OwnedOutput got = before;
    gmm::gmm(lhs.view(), rhs.grouped_view(), sizes, got.view(), options);
    return got;
  }
};

// Builds the operands of a gmm case: lhs [M, K], rhs [G, K, N] ([G, N, K] with transpose_rhs),
// output [M, N].
inline GmmCase make_gmm_case(Rng& rng, const CaseShape& s, const GmmRecipe& r,
                             const Options& options, DType out_dtype) {
  const OperandRecipe lhs_r = resolve(r.lhs, s.k, s.n), rhs_r = resolve(r.rhs, s.k, s.n);
  GmmCase c;
  c.lhs = random_matrix(rng, lhs_r.dtype, s.m, s.k, lhs_r.block, 3);
  const BlockShape& b = rhs_r.block;  // (G, K, N) orientation
  c.rhs = options.transpose_rhs ? random_grouped(rng, rhs_r.dtype, s.groups(), s.n, s.k,
                                                 {b.groups, b.cols, b.rows}, 2)
                                : random_grouped(rng, rhs_r.dtype, s.groups(), s.k, s.n, b, 2);
  c.options = options;
  c.options.quantize_lhs = lhs_r.quantize;
  c.before = options.accumulate ? random_output(rng, out_dtype, 1, s.m, s.n, 1)
                                : make_output(out_dtype, 1, s.m, s.n, 777.0f, 1);
  return c;
}

// Builds the operands of a gmm case and checks gmm::gmm against the oracle.
inline ::testing::AssertionResult run_gmm_case(Rng& rng, const CaseShape& s, const GmmRecipe& r,
                                               const Options& options, DType out_dtype,
                                               OwnedOutput* after = nullptr) {
  const GmmCase c = make_gmm_case(rng, s, r, options, out_dtype);
  return check_gmm(c.lhs.view(), c.rhs.grouped_view(), s.group_sizes, c.before, c.options, after);
}

// The operands, options and output of a tgmm case, before the call.
struct TgmmCase {
  OwnedMatrix lhs, rhs;
  Options options;
  OwnedOutput before;

  // gmm::tgmm on a copy of `before`, unchecked (for comparing runs bit for bit).
  OwnedOutput run(GroupSizes sizes) const {
    OwnedOutput got = before;
    gmm::tgmm(lhs.view(), rhs.view(), sizes, got.grouped_view(), options);
    return got;
  }
};

// Builds the operands of a tgmm case: lhs [M, K], rhs [M, N], output [G, K, N].
inline TgmmCase make_tgmm_case(Rng& rng, const CaseShape& s, const TgmmRecipe& r,
                               const Options& options, DType out_dtype, std::int64_t row_pad = 1,
                               std::int64_t out_offset = 0) {
  const OperandRecipe lhs_r = resolve(r.lhs, s.m, s.n), rhs_r = resolve(r.rhs, s.m, s.n);
  TgmmCase c;
  c.lhs = random_matrix(rng, lhs_r.dtype, s.m, s.k, lhs_r.block, 2);
  c.rhs = random_matrix(rng, rhs_r.dtype, s.m, s.n, rhs_r.block, 1);
  c.options = options;
  c.options.quantize_lhs = lhs_r.quantize;
  c.options.quantize_rhs = rhs_r.quantize;
  c.before = options.accumulate
                 ? random_output(rng, out_dtype, s.groups(), s.k, s.n, row_pad, out_offset)
                 : make_output(out_dtype, s.groups(), s.k, s.n, 777.0f, row_pad, out_offset);
  return c;
}

// Builds the operands of a tgmm case and checks gmm::tgmm against the oracle.
inline ::testing::AssertionResult run_tgmm_case(Rng& rng, const CaseShape& s, const TgmmRecipe& r,
                                                const Options& options, DType out_dtype,
                                                OwnedOutput* after = nullptr,
                                                std::int64_t row_pad = 1,
                                                std::int64_t out_offset = 0) {
  const TgmmCase c = make_tgmm_case(rng, s, r, options, out_dtype, row_pad, out_offset);
  return check_tgmm(c.lhs.view(), c.rhs.view(), s.group_sizes, c.before, c.options, after);
}

}  // namespace gmm::test::v2
