// Families v1 and v2 quantize the same values with the same blocks, so on every recipe and pass
// their outputs agree to fp32 summation error (not to quantization error).
#include <gtest/gtest.h>

#include <cmath>

#include "v2/v2_cases.hpp"

namespace gmm::test::v2 {
namespace {

// |v1 - v2| <= the sum of both families' error bounds against the exact result.
::testing::AssertionResult agree(const ref::Exact& exact, const OwnedOutput& v1,
                                 const OwnedOutput& v2, std::int64_t terms,
                                 std::int64_t row_blocks) {
  std::int64_t bad = 0;
  std::string first;
  for (std::int64_t g = 0; g < v1.groups; ++g) {
    for (std::int64_t r = 0; r < v1.rows; ++r) {
      const bool written = exact.written[row_blocks == 1 ? r : g];
      if (!written) continue;
      for (std::int64_t c = 0; c < v1.cols; ++c) {
        const std::size_t e = static_cast<std::size_t>((g * v1.rows + r) * v1.cols + c);
        const double a = v1.at(g, r, c), b = v2.at(g, r, c);
        const double bound =
            2 * error_bound(terms, exact.magnitude[e], 0.0, exact.value[e], v1.dtype);
        if (!(std::fabs(a - b) <= bound) && !(std::isnan(a) && std::isnan(b))) {
          if (bad++ == 0) {
            first = fmt::format("[{},{},{}]: v1 {} v2 {} bound {}", g, r, c, a, b, bound);
          }
        }
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " elements differ, first " << first;
}

TEST(V2VersusV1, GmmAgreesPerRecipeAndPass) {
  const CaseShape s{"agree", 70, 96, 40, {20, 0, 31, 19}};
  for (const GmmRecipe& r : gmm_recipes()) {
    for (bool transpose : {false, true}) {  // fwd, dlhs
      Rng rng(161);
      const OperandRecipe lhs_r = resolve(r.lhs, s.k, s.n), rhs_r = resolve(r.rhs, s.k, s.n);
      const OwnedMatrix lhs = random_matrix(rng, lhs_r.dtype, s.m, s.k, lhs_r.block);
      const BlockShape& b = rhs_r.block;
      const OwnedMatrix rhs =
          transpose ? random_grouped(rng, rhs_r.dtype, 4, s.n, s.k, {b.groups, b.cols, b.rows})
                    : random_grouped(rng, rhs_r.dtype, 4, s.k, s.n, b);
      OwnedOutput out[2] = {make_output(DType::f32, 1, s.m, s.n, 0.0f),
                            make_output(DType::f32, 1, s.m, s.n, 0.0f)};
      Options o;
      o.transpose_rhs = transpose;
      o.quantize_lhs = lhs_r.quantize;
      for (Family family : {Family::v1, Family::v2}) {
        o.family = family;
        gmm::gmm(lhs.view(), rhs.grouped_view(), s.group_sizes, out[family == Family::v2].view(),
                 o);
      }
      const GmmProblem p =
          make_gmm_problem("test", lhs.view(), rhs.grouped_view(), s.group_sizes, out[0].view(), o);
      EXPECT_TRUE(agree(ref::gmm_exact(p), out[0], out[1], s.k, 1))
          << r.label << (transpose ? " dlhs" : " fwd");
    }
  }
}

TEST(V2VersusV1, TgmmAgreesPerRecipe) {
  const CaseShape s{"agree", 72, 40, 36, {24, 0, 30, 18}};
  for (const TgmmRecipe& r : tgmm_recipes()) {
    Rng rng(171);
    const OperandRecipe lhs_r = resolve(r.lhs, s.m, s.n), rhs_r = resolve(r.rhs, s.m, s.n);
    const OwnedMatrix lhs = random_matrix(rng, lhs_r.dtype, s.m, s.k, lhs_r.block);
    const OwnedMatrix rhs = random_matrix(rng, rhs_r.dtype, s.m, s.n, rhs_r.block);
    OwnedOutput out[2] = {make_output(DType::f32, 4, s.k, s.n, 0.0f),
                          make_output(DType::f32, 4, s.k, s.n, 0.0f)};
    Options o;
    o.quantize_lhs = lhs_r.quantize;
    o.quantize_rhs = rhs_r.quantize;
    for (Family family : {Family::v1, Family::v2}) {
      o.family = family;
      gmm::tgmm(lhs.view(), rhs.view(), s.group_sizes, out[family == Family::v2].grouped_view(), o);
    }
    const TgmmProblem p =
        make_tgmm_problem("test", lhs.view(), rhs.view(), s.group_sizes, out[0].grouped_view(), o);
    EXPECT_TRUE(agree(ref::tgmm_exact(p), out[0], out[1], 30, 4)) << r.label << " drhs";
  }
}

}  // namespace
}  // namespace gmm::test::v2
