// Gradient check: for the unquantized recipe, central finite differences (fp64) of a scalar loss
// of the layer agree with gmm::backward, within a bound derived from the fp32 error of the
// passes and the fp64 rounding of the differences.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gmm/passes.hpp"
#include "support/compare.hpp"
#include "support/operands.hpp"
#include "support/random.hpp"

namespace gmm::test {
namespace {

// A tiny layer: 5 experts, 3 local from offset 1 (one of them empty), rows of non-local experts
// before and after the local ones.
constexpr std::int64_t kM = 14, kK = 6, kN = 5, kGroups = 3, kOffset = 1;
const std::vector<std::int32_t> kSizes = {3, 0, 6, 2, 3};

// L(x, w) = sum over rows r of local groups and columns n of c[r, n] y[r, n] + y[r, n]^2 / 2,
// y = x @ W_g in fp64, so dL/dy = c + y. `magnitude` receives sum |term|.
struct Loss {
  std::vector<double> c;  // [M, N]
  std::vector<std::int64_t> owner;

  double y(const std::vector<double>& x, const std::vector<double>& w, std::int64_t r,
           std::int64_t n, double* magnitude = nullptr) const {
    double sum = 0.0, abs_sum = 0.0;
    for (std::int64_t k = 0; k < kK; ++k) {
      const double t = x[r * kK + k] * w[(owner[r] * kK + k) * kN + n];
      sum += t;
      abs_sum += std::fabs(t);
    }
    if (magnitude != nullptr) *magnitude = abs_sum;
    return sum;
  }

  double operator()(const std::vector<double>& x, const std::vector<double>& w,
                    double* magnitude = nullptr) const {
    double sum = 0.0, abs_sum = 0.0;
    for (std::int64_t r = 0; r < kM; ++r) {
      if (owner[r] < 0) continue;
      for (std::int64_t n = 0; n < kN; ++n) {
        const double v = y(x, w, r, n);
        const double term = c[r * kN + n] * v + 0.5 * v * v;
        sum += term;
        abs_sum += std::fabs(c[r * kN + n] * v) + 0.5 * v * v;
      }
    }
    if (magnitude != nullptr) *magnitude = abs_sum;
    return sum;
  }
};

// Central difference of `loss` along element i of `a` (the other operand fixed), and its fp64
// rounding error: each loss evaluation is a sum of fewer than kM * kN * (kK + 2) roundings of
// terms bounded by `magnitude`.
template <typename Eval>
std::pair<double, double> central_difference(std::vector<double>& a, std::size_t i, double h,
                                             Eval&& eval) {
  const double saved = a[i];
  double magnitude = 0.0;
  a[i] = saved + h;
  const double up = eval(&magnitude);
  a[i] = saved - h;
  double magnitude_down = 0.0;
  const double down = eval(&magnitude_down);
  a[i] = saved;
  const double rounding =
      2.0 * (kM * kN * (kK + 2)) * 0x1p-52 * std::max(magnitude, magnitude_down);
  return {(up - down) / (2.0 * h), rounding / h};
}

TEST(GradientCheck, FiniteDifferencesAgreeWithBackwardUnquantized) {
  Rng rng(4242);
  const OwnedMatrix x = random_matrix(rng, DType::f32, kM, kK);
  const OwnedMatrix w = random_grouped(rng, DType::f32, kGroups, kK, kN);
  Loss loss;
  std::vector<double> xd, wd;
  for (std::int64_t r = 0; r < kM; ++r) {
    for (std::int64_t k = 0; k < kK; ++k) xd.push_back(x.stored(0, r, k));
    for (std::int64_t n = 0; n < kN; ++n) loss.c.push_back(rng.normal());
  }
  for (std::int64_t g = 0; g < kGroups; ++g) {
    for (std::int64_t k = 0; k < kK; ++k) {
      for (std::int64_t n = 0; n < kN; ++n) wd.push_back(w.stored(g, k, n));
    }
  }
  std::int64_t begin = 0;
  loss.owner.assign(kM, -1);
  for (std::size_t j = 0; j < kSizes.size(); ++j) {
    const std::int64_t g = static_cast<std::int64_t>(j) - kOffset;
    for (std::int64_t r = begin; r < begin + kSizes[j]; ++r) {
      if (g >= 0 && g < kGroups) loss.owner[r] = g;
    }
    begin += kSizes[j];
  }

  for (const Plan& plan : {Plan::v1(), Plan::v2(), Plan::hybrid()}) {
    SCOPED_TRACE(plan.to_string());
    OwnedOutput y = make_output(DType::f32, 1, kM, kN, 0.0f);
    OwnedOutput dx = make_output(DType::f32, 1, kM, kK, -1.0f);
    OwnedOutput dw = make_output(DType::f32, kGroups, kK, kN, -1.0f);
    const ExpertLayer layer{x.view(), w.grouped_view(), kSizes, kOffset};
    const Saved saved = forward(layer, y.view(), plan, Recipe::none());
    // dL/dy = c + y from the layer's own fp32 forward, as a trainer computes it; rows no local
    // group owns do not enter the loss.
    std::vector<float> dy(kM * kN, 0.0f);
    std::vector<double> y_error(kM * kN, 0.0);  // bound on |dy - (c + y_exact)|
    for (std::int64_t r = 0; r < kM; ++r) {
      if (loss.owner[r] < 0) continue;
      for (std::int64_t n = 0; n < kN; ++n) {
        double magnitude = 0.0;
        const double exact = loss.y(xd, wd, r, n, &magnitude);
        const std::int64_t i = r * kN + n;
        dy[i] = static_cast<float>(loss.c[i] + y.at(0, r, n));
        y_error[i] =
            error_bound(kK, magnitude, 0.0, exact, DType::f32) + kEpsF32 * std::fabs(dy[i]);
      }
    }
    backward(saved, view(dy.data(), kM, kN), {dx.view(), dw.grouped_view()}, plan);

    const double h = 0x1p-8;
    int nonzero = 0;
    for (std::int64_t r = 0; r < kM; ++r) {
      for (std::int64_t k = 0; k < kK; ++k) {
        const auto [fd, fd_error] = central_difference(xd, static_cast<std::size_t>(r * kK + k), h,
                                                       [&](double* m) { return loss(xd, wd, m); });
        double bound = fd_error;
        if (loss.owner[r] >= 0) {
          double magnitude = 0.0;
          for (std::int64_t n = 0; n < kN; ++n) {
            const double wv = wd[(loss.owner[r] * kK + k) * kN + n];
            bound += std::fabs(wv) * y_error[r * kN + n];
            magnitude += std::fabs(wv * dy[r * kN + n]);
          }
          bound += error_bound(kN, magnitude, 0.0, fd, DType::f32);
        }
        EXPECT_NEAR(dx.at(0, r, k), fd, bound) << "dx[" << r << "," << k << "]";
        nonzero += fd != 0.0;
      }
    }
    for (std::int64_t g = 0; g < kGroups; ++g) {
      for (std::int64_t k = 0; k < kK; ++k) {
        for (std::int64_t n = 0; n < kN; ++n) {
          const auto [fd, fd_error] =
              central_difference(wd, static_cast<std::size_t>((g * kK + k) * kN + n), h,
                                 [&](double* m) { return loss(xd, wd, m); });
          double bound = fd_error, magnitude = 0.0;
          std::int64_t terms = 0;
          for (std::int64_t r = 0; r < kM; ++r) {
            if (loss.owner[r] != g) continue;
            bound += std::fabs(xd[r * kK + k]) * y_error[r * kN + n];
            magnitude += std::fabs(xd[r * kK + k] * dy[r * kN + n]);
            ++terms;
          }
          bound += error_bound(terms, magnitude, 0.0, fd, DType::f32);
          EXPECT_NEAR(dw.at(g, k, n), fd, bound) << "dw[" << g << "," << k << "," << n << "]";
          nonzero += fd != 0.0;
        }
      }
    }
    // Rows 3..10 of two local groups drive the loss: their dx and those groups' dw are nonzero.
    EXPECT_EQ(nonzero, 8 * kK + 2 * kK * kN);
  }
}

}  // namespace
}  // namespace gmm::test
