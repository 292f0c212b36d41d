// Checks gmm / tgmm outputs against the fp64 oracle (gmm::ref::gmm_exact / tgmm_exact) with
// tolerances derived from the fp32 summation error bound.
//
// Usage:
//   OwnedOutput before = make_output(DType::f32, 1, M, N, 777.0f);   // or random_output(...)
//   EXPECT_TRUE(check_gmm(lhs.view(), rhs.grouped_view(), sizes, before, options));
// runs gmm::gmm (the family in `options`) on a copy of `before` and checks every element:
//   * rows / groups the call owns: |got - exact| <= error_bound(...), where exact includes the
//     previous value when options.accumulate (NaN expected exactly where the oracle is NaN);
//   * rows (gmm) / groups (tgmm) it does not own: +0.0, or bit-identical to `before` when
//     accumulating;
//   * row padding of the output: untouched.
// check_tgmm does the same for tgmm ([G, K, N] outputs). matches_gmm_oracle /
// matches_tgmm_oracle compare an output you produced yourself; same_bits compares two outputs
// bit for bit (thread-count determinism).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>

#include "gmm/ops.hpp"
#include "gmm/ref/reference.hpp"
#include "support/operands.hpp"

namespace gmm::test {

constexpr double kEpsF32 = 0x1p-23;   // fp32 machine epsilon (twice the unit roundoff)
constexpr double kUnitBf16 = 0x1p-8;  // bf16 unit roundoff (8 significant bits)

// Largest |got - total| allowed for one output element whose exact (fp64) result sums `terms`
// products with sum |a * b| = `magnitude`, `before` its previous value (0 unless accumulating)
// and `total` = exact + before: any fp32 summation order of n terms is within
// (n - 1) * u * magnitude, applying scales per segment and adding `before` cost a few more
// roundings, and a bf16 output adds one rounding of the fp32 result.
inline double error_bound(std::int64_t terms, double magnitude, double before, double total,
                          DType out) {
  double bound = static_cast<double>(terms + 4) * kEpsF32 * (magnitude + std::fabs(before));
  if (out == DType::bf16) bound += kUnitBf16 * (std::fabs(total) + bound);
  return bound;
}

namespace detail {

inline bool same_element_bits(const OwnedOutput& a, const OwnedOutput& b, std::int64_t index) {
  const std::size_t size = size_of(a.dtype);
  return std::memcmp(a.bytes.data() + index * size, b.bytes.data() + index * size, size) == 0;
}

// Collects the first few mismatches of an output check and counts them all.
class Mismatches {
 public:
  template <typename Describe>
  void add(Describe&& describe) {
    if (count_++ < 8) {
      text_ << "\n  ";
      describe(text_);
    }
  }
  ::testing::AssertionResult result(std::int64_t checked) const {
    if (count_ == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << count_ << " of " << checked << " output elements wrong:" << text_.str();
  }

 private:
  std::int64_t count_ = 0;
  std::ostringstream text_;
};

// Checks every element of `got` ([groups, rows, cols]) against `exact` (same shape, dense):
// written(g, r) says whether the call owns that output row, terms(g) the summation length.
template <typename Written, typename Terms>
::testing::AssertionResult check_output(const ref::Exact& exact, const OwnedOutput& before,
                                        const OwnedOutput& got, bool accumulate, Written&& written,
                                        Terms&& terms) {
  Mismatches bad;
  std::int64_t checked = 0;
  for (std::int64_t g = 0; g < got.groups; ++g) {
    for (std::int64_t r = 0; r < got.rows; ++r) {
      for (std::int64_t c = 0; c < got.cols; ++c, ++checked) {
        const std::int64_t index = got.index(g, r, c);
        const double value = got.at(g, r, c);
        const double previous = before.at(g, r, c);
        if (!written(g, r)) {
          if (accumulate ? !same_element_bits(before, got, index)
                         : (value != 0.0 || std::signbit(value))) {
            bad.add([&](std::ostream& os) {
              os << "out[" << g << "," << r << "," << c << "] = " << value << " outside the groups"
                 << " (expected " << (accumulate ? "untouched " : "+0, previous ") << previous
                 << ")";
            });
          }
          continue;
        }
        const std::size_t e = static_cast<std::size_t>((g * got.rows + r) * got.cols + c);
        const double base = accumulate ? previous : 0.0;
        const double total = exact.value[e] + base;
        const double bound = error_bound(terms(g), exact.magnitude[e], base, total, got.dtype);
        const bool ok = std::isnan(total) ? std::isnan(value)
                                          : (value == total || std::fabs(value - total) <= bound);
        if (!ok) {
          bad.add([&](std::ostream& os) {
            os.precision(9);
            os << "out[" << g << "," << r << "," << c << "] = " << value << ", expected " << total
               << " +- " << bound << " (sum|a*b| = " << exact.magnitude[e] << ")";
          });
        }
      }
    }
  }
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(got.bytes.size() / size_of(got.dtype));
       ++i) {
    const std::int64_t group_stride = std::max<std::int64_t>(1, got.group_stride);
    const std::int64_t row_stride = std::max<std::int64_t>(1, got.row_stride);
    const std::int64_t j = i - got.offset, in_group = j % group_stride;
    const bool logical = j >= 0 && j / group_stride < got.groups &&
                         in_group / row_stride < got.rows && in_group % row_stride < got.cols;
    if (!logical && !same_element_bits(before, got, i)) {
      bad.add([&](std::ostream& os) { os << "padding element " << i << " was written"; });
    }
  }
  return bad.result(checked);
}

}  // namespace detail

// Checks `got` (the output after a gmm call described by `p`) against the oracle, `before`
// being the output's contents before the call.
inline ::testing::AssertionResult matches_gmm_oracle(const GmmProblem& p, const OwnedOutput& before,
                                                     const OwnedOutput& got) {
  const ref::Exact exact = ref::gmm_exact(p);
  return detail::check_output(
      exact, before, got, p.accumulate,
      [&](std::int64_t, std::int64_t r) { return static_cast<bool>(exact.written[r]); },
      [&](std::int64_t) { return p.k; });
}

// Checks `got` (the [G, K, N] output after a tgmm call described by `p`) against the oracle.
inline ::testing::AssertionResult matches_tgmm_oracle(const TgmmProblem& p,
                                                      const OwnedOutput& before,
                                                      const OwnedOutput& got) {
  const ref::Exact exact = ref::tgmm_exact(p);
  return detail::check_output(
      exact, before, got, p.accumulate,
      [&](std::int64_t g, std::int64_t) { return static_cast<bool>(exact.written[g]); },
      [&](std::int64_t g) { return p.groups.size(g); });
}

// Runs gmm::gmm on a copy of `before` and checks the result against the oracle; the output is
// moved to `*after` when given.
inline ::testing::AssertionResult check_gmm(const Matrix& lhs, const GroupedMatrix& rhs,
                                            GroupSizes sizes, const OwnedOutput& before,
                                            const Options& options, OwnedOutput* after = nullptr) {
  OwnedOutput got = before;
  gmm::gmm(lhs, rhs, sizes, got.view(), options);
  const GmmProblem p = make_gmm_problem("check_gmm", lhs, rhs, sizes, got.view(), options);
  ::testing::AssertionResult result = matches_gmm_oracle(p, before, got);
  if (after != nullptr) *after = std::move(got);
  return result;
}

// Runs gmm::tgmm on a copy of `before` ([G, K, N]) and checks the result against the oracle.
inline ::testing::AssertionResult check_tgmm(const Matrix& lhs, const Matrix& rhs, GroupSizes sizes,
                                             const OwnedOutput& before, const Options& options,
                                             OwnedOutput* after = nullptr) {
  OwnedOutput got = before;
  gmm::tgmm(lhs, rhs, sizes, got.grouped_view(), options);
  const TgmmProblem p =
      make_tgmm_problem("check_tgmm", lhs, rhs, sizes, got.grouped_view(), options);
  ::testing::AssertionResult result = matches_tgmm_oracle(p, before, got);
  if (after != nullptr) *after = std::move(got);
  return result;
}

// True when two outputs are identical bit for bit (padding included).
inline ::testing::AssertionResult same_bits(const OwnedOutput& a, const OwnedOutput& b) {
  if (a.bytes == b.bytes) return ::testing::AssertionSuccess();
  const std::int64_t count = static_cast<std::int64_t>(a.bytes.size() / size_of(a.dtype));
  for (std::int64_t i = 0; i < count; ++i) {
    if (!detail::same_element_bits(a, b, i)) {
      return ::testing::AssertionFailure() << "outputs differ first at element " << i << ": "
                                           << load_as_float(a.bytes.data(), a.dtype, i) << " vs "
                                           << load_as_float(b.bytes.data(), b.dtype, i);
    }
  }
  return ::testing::AssertionFailure() << "outputs differ in size";
}

}  // namespace gmm::test
