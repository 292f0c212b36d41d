// v1 behaviour beyond single results: thread-count determinism, errors before writing, the
// trace, default tiles, degenerate extents.
#include <gtest/gtest.h>

#include <vector>

#include "support/cases.hpp"
#include "support/compare.hpp"
#include "support/invalid_calls.hpp"

namespace gmm::test {
namespace {

Options v1(Options o = {}) {
  o.family = Family::v1;
  return o;
}

// Many tasks (small tiles over a mid-sized problem) so that every thread count splits them
// differently.
TEST(V1Determinism, GmmIsBitwiseIdenticalForAnyThreadCount) {
  Rng rng(41);
  const std::int64_t m = 203, k = 96, n = 70;
  const std::vector<std::int32_t> sizes = random_group_sizes(rng, 6, 190, 0.2);
  const Recipe recipes[] = {
      Recipe("f32", DType::f32, {}, DType::f32, {}),
      Recipe("dynamic e4m3 1x16 x 32x14 blocks", DType::bf16, {}, DType::float8_e4m3fn, {1, 32, 14},
             dynamic(QType::float8_e4m3fn, 16)),
      Recipe("int8 per-row x per-channel", DType::int8, {1, 1, 0}, DType::int8, {1, 0, 1})};
  for (const Recipe& recipe : recipes) {
    for (const bool transpose : {false, true}) {
      SCOPED_TRACE(recipe.name + (transpose ? " transpose_rhs" : ""));
      GroupPattern pattern{"random", m, sizes, 6, 0};
      GmmCase c = make_gmm_case(rng, recipe, pattern, k, n, {DType::bf16, true, true, transpose});
      Options options = v1(c.options);
      options.tiles = {16, 32, 16};
      options.threads = 1;
      OwnedOutput single;
      ASSERT_TRUE(check_gmm(c.lhs.view(), c.rhs.grouped_view(), c.sizes, c.out, options, &single));
      for (const int threads : {2, 3, 5, 8}) {
        options.threads = threads;
        OwnedOutput multi = c.out;
        gmm::gmm(c.lhs.view(), c.rhs.grouped_view(), c.sizes, multi.view(), options);
        EXPECT_TRUE(same_bits(single, multi)) << threads << " threads";
      }
    }
  }
}

TEST(V1Determinism, TgmmIsBitwiseIdenticalForAnyThreadCount) {
  Rng rng(42);
  const std::int64_t m = 180, k = 70, n = 50;
  const std::vector<std::int32_t> sizes = random_group_sizes(rng, 5, 175, 0.2);
  const Recipe recipes[] = {
      Recipe("bf16", DType::bf16, {}, DType::bf16, {}),
      Recipe("dynamic e4m3 x e5m2", DType::f32, {}, DType::bf16, {},
             dynamic(QType::float8_e4m3fn, 12), dynamic(QType::float8_e5m2, 20))};
  for (const Recipe& recipe : recipes) {
    SCOPED_TRACE(recipe.name);
    GroupPattern pattern{"random", m, sizes, 5, 0};
    TgmmCase c = make_tgmm_case(rng, recipe, pattern, k, n, {DType::f32, false, true, false});
    Options options = v1(c.options);
    options.tiles = {16, 16, 16};
    options.threads = 1;
    OwnedOutput single;
    ASSERT_TRUE(check_tgmm(c.lhs.view(), c.rhs.view(), c.sizes, c.out, options, &single));
    for (const int threads : {2, 3, 7}) {
      options.threads = threads;
      OwnedOutput multi = c.out;
      gmm::tgmm(c.lhs.view(), c.rhs.view(), c.sizes, multi.grouped_view(), options);
      EXPECT_TRUE(same_bits(single, multi)) << threads << " threads";
    }
  }
}

void run_gmm(InvalidCall& call) {
  gmm::gmm(call.lhs.view(), call.rhs.grouped_view(), call.sizes, call.out_view(), v1(call.options));
}

void run_tgmm(InvalidCall& call) {
  gmm::tgmm(call.lhs.view(), call.rhs.view(), call.sizes, call.out_grouped_view(),
            v1(call.options));
}

TEST(V1Errors, GmmRejectsBeforeWriting) {
  for (InvalidCall& c : invalid_gmm_calls()) {
    EXPECT_TRUE(rejects_before_writing(c, run_gmm));
  }
}

TEST(V1Errors, TgmmRejectsBeforeWriting) {
  for (InvalidCall& c : invalid_tgmm_calls()) {
    EXPECT_TRUE(rejects_before_writing(c, run_tgmm));
  }
}

// v1 has no ISA dispatch: forcing any path, even the one Eigen was compiled for, is an error
// rather than a silent fallback.
TEST(V1Errors, ForcedIsaIsRejected) {
  Rng rng(43);
  for (const Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512f, Isa::avx512bf16, Isa::amx}) {
    SCOPED_TRACE(name(isa));
    InvalidCall g = detail::valid_gmm(rng, "forced isa (gmm)", "options.isa");
    g.options.isa = isa;
    EXPECT_TRUE(rejects_before_writing(g, run_gmm));
    InvalidCall t = detail::valid_tgmm(rng, "forced isa (tgmm)", "options.isa");
    t.options.isa = isa;
    EXPECT_TRUE(rejects_before_writing(t, run_tgmm));
  }
}

TEST(V1Errors, NegativeTileIsRejected) {
  Rng rng(44);
  for (const Tiles tiles : {Tiles{-1, 0, 0}, Tiles{0, -8, 0}, Tiles{0, 0, -2}}) {
    InvalidCall g = detail::valid_gmm(rng, "negative tile (gmm)", "options.tiles");
    g.options.tiles = tiles;
    EXPECT_TRUE(rejects_before_writing(g, run_gmm));
    InvalidCall t = detail::valid_tgmm(rng, "negative tile (tgmm)", "options.tiles");
    t.options.tiles = tiles;
    EXPECT_TRUE(rejects_before_writing(t, run_tgmm));
  }
}

Isa expected_isa() {
#if defined(EIGEN_VECTORIZE_AVX512)
  return Isa::avx512f;
#elif defined(EIGEN_VECTORIZE_AVX2)
  return Isa::avx2;
#else
  return Isa::scalar;
#endif
}

TEST(V1Trace, GmmReportsWhatRan) {
  Rng rng(45);
  const std::int64_t m = 16, k = 32, n = 8;
  OwnedMatrix x = random_matrix(rng, DType::bf16, m, k);
  OwnedMatrix w = random_grouped(rng, DType::float8_e4m3fn, 2, k, n, {1, 0, 1});
  OwnedOutput out = make_output(DType::f32, 1, m, n, 0.0f);
  CallTrace trace;
  trace.op = "stale";
  Options options = v1();
  options.quantize_lhs = QuantSpec{QType::float8_e5m2, Calibration::absmax(), 16};
  options.tiles = {8, 0, 4};
  options.threads = 2;
  options.trace = &trace;
  gmm::gmm(x.view(), w.grouped_view(), std::vector<std::int32_t>{6, 9}, out.view(), options);
  EXPECT_EQ(trace.op, "gmm");
  EXPECT_EQ(trace.family, Family::v1);
  EXPECT_EQ(trace.isa, expected_isa());
  EXPECT_EQ(trace.tiles.m, 8);
  EXPECT_EQ(trace.tiles.k, 256);  // default
  EXPECT_EQ(trace.tiles.n, 4);
  EXPECT_EQ(trace.threads, 2);
  EXPECT_EQ(trace.lhs.dtype, DType::float8_e5m2);
  EXPECT_TRUE(trace.lhs.quantized);
  EXPECT_EQ(trace.lhs.block, (BlockShape{1, 1, 16}));
  EXPECT_EQ(trace.lhs.quantized_by, "outside kernel");
  EXPECT_EQ(trace.rhs.dtype, DType::float8_e4m3fn);
  EXPECT_TRUE(trace.rhs.quantized);
  EXPECT_EQ(trace.rhs.block, (BlockShape{1, k, 1}));
  EXPECT_EQ(trace.rhs.quantized_by, "caller");
  // The materialized lhs (M * K bytes and M * K / 16 scales) is part of the peak.
  EXPECT_GE(trace.extra_bytes, m * k + (m * k / 16) * 4);

  options.quantize_lhs.reset();
  options.tiles = {};
  gmm::gmm(x.view(), w.grouped_view(), std::vector<std::int32_t>{6, 9}, out.view(), options);
  EXPECT_EQ(trace.lhs.dtype, DType::bf16);
  EXPECT_FALSE(trace.lhs.quantized);
  EXPECT_EQ(trace.lhs.quantized_by, "");
  EXPECT_EQ(trace.tiles.m, 128);
  EXPECT_EQ(trace.tiles.n, 512);
}

TEST(V1Trace, TgmmReportsWhatRan) {
  Rng rng(46);
  const std::int64_t m = 24, k = 5, n = 6;
  OwnedMatrix x = random_matrix(rng, DType::f32, m, k);
  OwnedMatrix dy = random_matrix(rng, DType::float8_e5m2, m, n, {1, 0, 1});
  OwnedOutput out = make_output(DType::bf16, 2, k, n, 0.0f);
  CallTrace trace;
  Options options = v1();
  options.quantize_lhs = QuantSpec{QType::int8, Calibration::fixed(3.0f), 0};
  options.threads = 1;
  options.trace = &trace;
  gmm::tgmm(x.view(), dy.view(), std::vector<std::int32_t>{10, 14}, out.grouped_view(), options);
  EXPECT_EQ(trace.op, "tgmm");
  EXPECT_EQ(trace.family, Family::v1);
  EXPECT_EQ(trace.tiles.m, 256);
  EXPECT_EQ(trace.threads, 1);
  EXPECT_EQ(trace.lhs.dtype, DType::int8);
  EXPECT_EQ(trace.lhs.block, (BlockShape{1, m, k}));  // fixed: one static per-tensor scale
  EXPECT_EQ(trace.lhs.quantized_by, "outside kernel");
  EXPECT_EQ(trace.rhs.dtype, DType::float8_e5m2);
  EXPECT_EQ(trace.rhs.block, (BlockShape{1, m, 1}));
  EXPECT_EQ(trace.rhs.quantized_by, "caller");
  EXPECT_GE(trace.extra_bytes, m * k + 4);
}

// Default tiles on shapes a bit larger than one tile along every axis.
TEST(V1DefaultTiles, GmmAndTgmmMatchTheOracle) {
  Rng rng(47);
  const std::int64_t m = 300, k = 640, n = 270;
  const std::vector<std::int32_t> sizes = random_group_sizes(rng, 3, 290, 0.0);
  GroupPattern pattern{"random", m, sizes, 3, 0};
  const Recipe fp8_blocks("e4m3 1x128 x 128x90", DType::f32, {}, DType::float8_e4m3fn, {1, 128, 90},
                          dynamic(QType::float8_e4m3fn, 128));
  GmmCase c = make_gmm_case(rng, fp8_blocks, pattern, k, n, {DType::bf16, false, true, false});
  EXPECT_TRUE(check_gmm(c.lhs.view(), c.rhs.grouped_view(), c.sizes, c.out, v1(c.options)));
  const Recipe bf16("bf16", DType::bf16, {}, DType::bf16, {});
  TgmmCase t = make_tgmm_case(rng, bf16, pattern, 270, 260, {DType::f32, true, false, false});
  EXPECT_TRUE(check_tgmm(t.lhs.view(), t.rhs.view(), t.sizes, t.out, v1(t.options)));
}

TEST(V1Degenerate, EmptyExtentsMatchTheOracle) {
  Rng rng(48);
  for (const std::int64_t m : {0, 5}) {
    for (const std::int64_t k : {0, 3}) {
      for (const std::int64_t n : {0, 4}) {
        SCOPED_TRACE(fmt::format("M={} K={} N={}", m, k, n));
        const std::vector<std::int32_t> sizes{0, static_cast<std::int32_t>(m > 0 ? 3 : 0)};
        for (const bool accumulate : {false, true}) {
          Options options = v1();
          options.accumulate = accumulate;
          OwnedMatrix x = random_matrix(rng, DType::f32, m, k);
          OwnedMatrix w = random_grouped(rng, DType::bf16, 2, k, n);
          EXPECT_TRUE(check_gmm(x.view(), w.grouped_view(), sizes,
                                random_output(rng, DType::f32, 1, m, n), options));
          OwnedMatrix dy = random_matrix(rng, DType::bf16, m, n);
          EXPECT_TRUE(check_tgmm(x.view(), dy.view(), sizes,
                                 random_output(rng, DType::bf16, 2, k, n), options));
        }
      }
    }
  }
}

}  // namespace
}  // namespace gmm::test
