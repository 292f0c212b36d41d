// The fp64 oracle gmm::ref on hand-computed cases and identities (it checks everything else).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gmm/ref/reference.hpp"
#include "support/compare.hpp"
#include "support/operands.hpp"

namespace gmm::test {
namespace {

constexpr float kSentinel = 777.0f;

// Values of an output as a flat row-major vector (padding skipped).
std::vector<float> values(const OwnedOutput& o) {
  std::vector<float> v;
  for (std::int64_t g = 0; g < o.groups; ++g) {
    for (std::int64_t r = 0; r < o.rows; ++r) {
      for (std::int64_t c = 0; c < o.cols; ++c) v.push_back(o.at(g, r, c));
    }
  }
  return v;
}

// A near-exact comparison for identities computed in fp64 by two routes: one fp32 rounding of
// the result plus fp64 summation error.
::testing::AssertionResult near_exact(const std::vector<float>& got,
                                      const std::vector<double>& exact,
                                      const std::vector<double>& magnitude, std::int64_t terms) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double bound = 0x1p-24 * std::fabs(exact[i]) + terms * 0x1p-52 * magnitude[i];
    if (!(std::fabs(got[i] - exact[i]) <= bound)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got[i] << " vs " << exact[i] << " +- " << bound;
    }
  }
  return ::testing::AssertionSuccess();
}

// lhs [4, 2], two groups of sizes [1, 2] (row 3 owned by none), W0 = I, W1 = [[1, 1], [2, -1]].
struct HandGmm {
  OwnedMatrix lhs = matrix_from(DType::f32, 4, 2, {1, 2, 3, 4, 5, 6, 7, 8});
  OwnedMatrix rhs = grouped_from(DType::f32, 2, 2, 2, {1, 0, 0, 1, 1, 1, 2, -1});
  OwnedMatrix rhs_t = grouped_from(DType::f32, 2, 2, 2, {1, 0, 0, 1, 1, 2, 1, -1});
  std::vector<std::int32_t> sizes{1, 2};
  std::vector<float> expected{1, 2, 11, -1, 17, -1, 0, 0};
};

TEST(RefGmmHand, TwoGroupsAndAnUnownedRow) {
  HandGmm c;
  OwnedOutput out = make_output(DType::f32, 1, 4, 2, kSentinel, 1);
  ref::gmm(c.lhs.view(), c.rhs.grouped_view(), c.sizes, out.view());
  EXPECT_EQ(values(out), c.expected);
  EXPECT_EQ(out.at(0, 0, 2), kOutputPadding);
}

TEST(RefGmmHand, TransposeRhs) {
  HandGmm c;
  OwnedOutput out = make_output(DType::f32, 1, 4, 2, kSentinel);
  Options options;
  options.transpose_rhs = true;
  ref::gmm(c.lhs.view(), c.rhs_t.grouped_view(), c.sizes, out.view(), options);
  EXPECT_EQ(values(out), c.expected);
}

TEST(RefGmmHand, AccumulateLeavesUnownedRowsUntouched) {
  HandGmm c;
  OwnedOutput out = make_output(DType::f32, 1, 4, 2, 0.5f);
  Options options;
  options.accumulate = true;
  ref::gmm(c.lhs.view(), c.rhs.grouped_view(), c.sizes, out.view(), options);
  EXPECT_EQ(values(out), (std::vector<float>{1.5, 2.5, 11.5, -0.5, 17.5, -0.5, 0.5, 0.5}));
}

TEST(RefGmmHand, GroupOffsetUsesLocalExpertsOnly) {
  // Global sizes [1, 2, 1]; this shard holds experts 1 and 2: rows [1, 3) use rhs[0] = W1 and
  // row 3 uses rhs[1] = 2 * I; row 0 (expert 0, another shard) is zero.
  OwnedMatrix lhs = matrix_from(DType::f32, 4, 2, {1, 2, 3, 4, 5, 6, 7, 8});
  OwnedMatrix rhs = grouped_from(DType::f32, 2, 2, 2, {1, 1, 2, -1, 2, 0, 0, 2});
  OwnedOutput out = make_output(DType::f32, 1, 4, 2, kSentinel);
  Options options;
  options.group_offset = 1;
  ref::gmm(lhs.view(), rhs.grouped_view(), std::vector<std::int32_t>{1, 2, 1}, out.view(), options);
  EXPECT_EQ(values(out), (std::vector<float>{0, 0, 11, -1, 17, -1, 14, 16}));
}

TEST(RefGmmHand, QuantizedPerRowTimesPerChannel) {
  // int8 lhs [[1, 2], [3, 4]] with row scales [0.5, 2]; int8 W = I with column scales [3, 0.25].
  OwnedMatrix lhs = matrix_from(DType::int8, 2, 2, {1, 2, 3, 4}, {1, 1, 0}, {0.5f, 2.0f});
  OwnedMatrix rhs = grouped_from(DType::int8, 1, 2, 2, {1, 0, 0, 1}, {1, 0, 1}, {3.0f, 0.25f});
  OwnedOutput out = make_output(DType::f32, 1, 2, 2, kSentinel);
  ref::gmm(lhs.view(), rhs.grouped_view(), std::vector<std::int32_t>{2}, out.view());
  EXPECT_EQ(values(out), (std::vector<float>{1.5f, 0.25f, 18.0f, 2.0f}));
}

TEST(RefGmmHand, Bf16OutputRoundsOnce) {
  // 1 + 2^-8 + 2^-20 is not representable in bf16; rounded once (to nearest) it is 1 + 2^-7.
  OwnedMatrix lhs = matrix_from(DType::f32, 1, 3, {1.0f, 0x1p-8f, 0x1p-20f});
  OwnedMatrix rhs = grouped_from(DType::f32, 1, 3, 1, {1, 1, 1});
  OwnedOutput out = make_output(DType::bf16, 1, 1, 1, kSentinel);
  ref::gmm(lhs.view(), rhs.grouped_view(), std::vector<std::int32_t>{1}, out.view());
  EXPECT_EQ(out.at(0, 0, 0), 1.0f + 0x1p-7f);
}

// x = [[1, 2], [3, 4], [5, 6]], dy = [[1, 0], [0, 1], [2, 2]], sizes [2, 1, 0].
TEST(RefTgmmHand, PerGroupProductsAndEmptyGroup) {
  OwnedMatrix x = matrix_from(DType::f32, 3, 2, {1, 2, 3, 4, 5, 6});
  OwnedMatrix dy = matrix_from(DType::f32, 3, 2, {1, 0, 0, 1, 2, 2});
  OwnedOutput out = make_output(DType::f32, 3, 2, 2, kSentinel);
  ref::tgmm(x.view(), dy.view(), std::vector<std::int32_t>{2, 1, 0}, out.grouped_view());
  EXPECT_EQ(values(out), (std::vector<float>{1, 3, 2, 4, 10, 10, 12, 12, 0, 0, 0, 0}));

  OwnedOutput acc = make_output(DType::f32, 3, 2, 2, 1.0f);
  Options options;
  options.accumulate = true;
  ref::tgmm(x.view(), dy.view(), std::vector<std::int32_t>{2, 1, 0}, acc.grouped_view(), options);
  EXPECT_EQ(values(acc), (std::vector<float>{2, 4, 3, 5, 11, 11, 13, 13, 1, 1, 1, 1}));
}

TEST(RefTgmmHand, PerColumnQuantizedOperands) {
  // fp8 x [[1, 2], [4, 8]] with column scales [2, 0.5]; dy [[1], [2]] with scale 4.
  OwnedMatrix x = matrix_from(DType::float8_e4m3fn, 2, 2, {1, 2, 4, 8}, {1, 0, 1}, {2.0f, 0.5f});
  OwnedMatrix dy = matrix_from(DType::float8_e5m2, 2, 1, {1, 2}, {0, 0, 0}, {4.0f});
  OwnedOutput out = make_output(DType::f32, 1, 2, 1, kSentinel);
  ref::tgmm(x.view(), dy.view(), std::vector<std::int32_t>{2}, out.grouped_view());
  // k = 0: (1 * 2 * 1 + 4 * 2 * 2) * 4 = 72; k = 1: (2 * 0.5 * 1 + 8 * 0.5 * 2) * 4 = 36.
  EXPECT_EQ(values(out), (std::vector<float>{72, 36}));
}

// ---- Identities on random data ------------------------------------------------------------

// Dense fp64 product of x [m, k] rows [r0, r1) with w (element w(kk, n)).
template <typename W>
void dense_rows(const OwnedMatrix& x, std::int64_t r0, std::int64_t r1, std::int64_t n_cols, W&& w,
                std::vector<double>& value, std::vector<double>& magnitude) {
  for (std::int64_t r = r0; r < r1; ++r) {
    for (std::int64_t n = 0; n < n_cols; ++n) {
      double sum = 0, mag = 0;
      for (std::int64_t k = 0; k < x.cols; ++k) {
        const double t = static_cast<double>(x.stored(0, r, k)) * w(k, n);
        sum += t;
        mag += std::fabs(t);
      }
      value[r * n_cols + n] = sum;
      magnitude[r * n_cols + n] = mag;
    }
  }
}

TEST(RefGmmIdentity, SingleGroupEqualsDenseMatmul) {
  Rng rng(11);
  const std::int64_t m = 9, k = 13, n = 7;
  OwnedMatrix x = random_matrix(rng, DType::f32, m, k, {}, 3);
  OwnedMatrix w = random_grouped(rng, DType::bf16, 1, k, n);
  OwnedOutput out = make_output(DType::f32, 1, m, n, kSentinel);
  ref::gmm(x.view(), w.grouped_view(), std::vector<std::int32_t>{static_cast<std::int32_t>(m)},
           out.view());
  std::vector<double> value(m * n), magnitude(m * n);
  dense_rows(
      x, 0, m, n, [&](std::int64_t kk, std::int64_t nn) { return w.stored(0, kk, nn); }, value,
      magnitude);
  EXPECT_TRUE(near_exact(values(out), value, magnitude, k));
}

TEST(RefGmmIdentity, SplittingAGroupChangesNothing) {
  Rng rng(12);
  const std::int64_t m = 10, k = 6, n = 5;
  OwnedMatrix x = random_matrix(rng, DType::f32, m, k);
  OwnedMatrix w = random_grouped(rng, DType::f32, 1, k, n);
  OwnedMatrix w_twice =
      make_matrix(DType::f32, 2, k, n,
                  [&](std::int64_t, std::int64_t r, std::int64_t c) { return w.stored(0, r, c); });
  OwnedOutput whole = make_output(DType::f32, 1, m, n, kSentinel);
  OwnedOutput split = make_output(DType::f32, 1, m, n, kSentinel);
  ref::gmm(x.view(), w.grouped_view(), std::vector<std::int32_t>{8}, whole.view());
  ref::gmm(x.view(), w_twice.grouped_view(), std::vector<std::int32_t>{3, 5}, split.view());
  EXPECT_TRUE(same_bits(whole, split));
}

TEST(RefGmmIdentity, TransposeRhsEqualsExplicitTranspose) {
  Rng rng(13);
  const std::int64_t m = 12, k = 7, n = 4, groups = 3;
  OwnedMatrix x = random_matrix(rng, DType::f32, m, k);
  OwnedMatrix w = random_grouped(rng, DType::float8_e4m3fn, groups, k, n, {1, 0, 1});
  // w_t[g] = w[g]^T with the same per-channel scales, now one per row of [G, N, K].
  OwnedMatrix w_t = make_matrix(
      DType::float8_e4m3fn, groups, n, k,
      [&](std::int64_t g, std::int64_t r, std::int64_t c) { return w.stored(g, c, r); }, {1, 1, 0},
      w.scales);
  const std::vector<std::int32_t> sizes{5, 0, 6};
  OwnedOutput plain = make_output(DType::f32, 1, m, n, kSentinel);
  OwnedOutput transposed = make_output(DType::f32, 1, m, n, kSentinel);
  ref::gmm(x.view(), w.grouped_view(), sizes, plain.view());
  Options options;
  options.transpose_rhs = true;
  ref::gmm(x.view(), w_t.grouped_view(), sizes, transposed.view(), options);
  EXPECT_TRUE(same_bits(plain, transposed));
}

TEST(RefGmmIdentity, GroupOffsetShardEqualsTheGlobalCallOnItsRows) {
  Rng rng(14);
  const std::int64_t m = 16, k = 5, n = 3, experts = 5;
  const std::vector<std::int32_t> sizes{3, 0, 4, 5, 2};  // sum 14 < 16
  OwnedMatrix x = random_matrix(rng, DType::f32, m, k);
  OwnedMatrix w = random_grouped(rng, DType::f32, experts, k, n);
  OwnedOutput global = make_output(DType::f32, 1, m, n, kSentinel);
  ref::gmm(x.view(), w.grouped_view(), sizes, global.view());
  // Shard holding experts [1, 4): rhs are w[1..3], rows [3, 12).
  OwnedMatrix shard_w = make_matrix(
      DType::f32, 3, k, n,
      [&](std::int64_t g, std::int64_t r, std::int64_t c) { return w.stored(g + 1, r, c); });
  Options options;
  options.group_offset = 1;
  OwnedOutput shard = make_output(DType::f32, 1, m, n, kSentinel);
  ref::gmm(x.view(), shard_w.grouped_view(), sizes, shard.view(), options);
  options.accumulate = true;
  OwnedOutput shard_acc = make_output(DType::f32, 1, m, n, kSentinel);
  ref::gmm(x.view(), shard_w.grouped_view(), sizes, shard_acc.view(), options);
  for (std::int64_t r = 0; r < m; ++r) {
    const bool local = r >= 3 && r < 12;
    for (std::int64_t c = 0; c < n; ++c) {
      EXPECT_EQ(shard.at(0, r, c), local ? global.at(0, r, c) : 0.0f) << r << "," << c;
      EXPECT_EQ(shard_acc.at(0, r, c),
                local ? static_cast<float>(static_cast<double>(kSentinel) + global.at(0, r, c))
                      : kSentinel)
          << r << "," << c;
    }
  }
}

TEST(RefTgmmIdentity, EqualsSumOfPerGroupOuterProducts) {
  Rng rng(15);
  const std::int64_t m = 11, k = 4, n = 6;
  const std::vector<std::int32_t> sizes{4, 0, 6};  // row 10 owned by none
  OwnedMatrix x = random_matrix(rng, DType::bf16, m, k, {}, 2);
  OwnedMatrix dy = random_matrix(rng, DType::f32, m, n);
  OwnedOutput out = make_output(DType::f32, 3, k, n, kSentinel);
  ref::tgmm(x.view(), dy.view(), sizes, out.grouped_view());
  std::vector<double> value(3 * k * n, 0.0), magnitude(3 * k * n, 0.0);
  std::int64_t row = 0;
  for (std::int64_t g = 0; g < 3; ++g) {
    for (std::int64_t i = 0; i < sizes[g]; ++i, ++row) {
      for (std::int64_t a = 0; a < k; ++a) {
        for (std::int64_t b = 0; b < n; ++b) {
          const double t = static_cast<double>(x.stored(0, row, a)) * dy.stored(0, row, b);
          value[(g * k + a) * n + b] += t;
          magnitude[(g * k + a) * n + b] += std::fabs(t);
        }
      }
    }
  }
  EXPECT_TRUE(near_exact(values(out), value, magnitude, m));
}

TEST(RefTgmmIdentity, SplittingAGroupSumsItsBlocks) {
  Rng rng(16);
  const std::int64_t m = 9, k = 3, n = 4;
  OwnedMatrix x = random_matrix(rng, DType::f32, m, k);
  OwnedMatrix dy = random_matrix(rng, DType::f32, m, n);
  OwnedOutput whole = make_output(DType::f32, 1, k, n, kSentinel);
  OwnedOutput split = make_output(DType::f32, 2, k, n, kSentinel);
  ref::tgmm(x.view(), dy.view(), std::vector<std::int32_t>{9}, whole.grouped_view());
  ref::tgmm(x.view(), dy.view(), std::vector<std::int32_t>{4, 5}, split.grouped_view());
  const ref::Exact first = ref::tgmm_exact(make_tgmm_problem(
      "test", x.view(), dy.view(), std::vector<std::int32_t>{4, 5}, split.grouped_view(), {}));
  for (std::int64_t a = 0; a < k; ++a) {
    for (std::int64_t b = 0; b < n; ++b) {
      const double sum = first.value[a * n + b] + first.value[(k + a) * n + b];
      const double mag = first.magnitude[a * n + b] + first.magnitude[(k + a) * n + b];
      EXPECT_NEAR(whole.at(0, a, b), sum, 0x1p-24 * std::fabs(sum) + 0x1p-50 * mag);
    }
  }
}

TEST(RefGmmIdentity, Bf16OutputIsTheFp32ResultRounded) {
  Rng rng(17);
  const std::int64_t m = 8, k = 33, n = 9;
  OwnedMatrix x = random_matrix(rng, DType::bf16, m, k);
  OwnedMatrix w = random_grouped(rng, DType::float8_e5m2, 2, k, n, {1, 1, 0});
  const std::vector<std::int32_t> sizes{3, 4};
  OwnedOutput f32 = make_output(DType::f32, 1, m, n, kSentinel);
  OwnedOutput bf16 = make_output(DType::bf16, 1, m, n, kSentinel);
  ref::gmm(x.view(), w.grouped_view(), sizes, f32.view());
  ref::gmm(x.view(), w.grouped_view(), sizes, bf16.view());
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t c = 0; c < n; ++c) {
      EXPECT_EQ(bf16.at(0, r, c), static_cast<float>(bfloat16(f32.at(0, r, c))));
    }
  }
}

TEST(RefGmmIdentity, EmptyGroupsOwnNoRows) {
  Rng rng(18);
  const std::int64_t m = 6, k = 4, n = 3;
  OwnedMatrix x = random_matrix(rng, DType::f32, m, k);
  OwnedMatrix w = random_grouped(rng, DType::f32, 4, k, n);
  OwnedMatrix w_nonempty =
      make_matrix(DType::f32, 2, k, n, [&](std::int64_t g, std::int64_t r, std::int64_t c) {
        return w.stored(g == 0 ? 1 : 3, r, c);
      });
  OwnedOutput with_empty = make_output(DType::f32, 1, m, n, kSentinel);
  OwnedOutput without = make_output(DType::f32, 1, m, n, kSentinel);
  ref::gmm(x.view(), w.grouped_view(), std::vector<std::int32_t>{0, 2, 0, 4}, with_empty.view());
  ref::gmm(x.view(), w_nonempty.grouped_view(), std::vector<std::int32_t>{2, 4}, without.view());
  EXPECT_TRUE(same_bits(with_empty, without));
}

}  // namespace
}  // namespace gmm::test
