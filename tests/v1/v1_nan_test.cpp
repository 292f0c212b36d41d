// v1 NaN isolation: a NaN in one expert's weights or one group's rows reaches only that group's
// output rows (gmm) or block (tgmm), never another group's (as Tokamax tests).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/compare.hpp"
#include "support/operands.hpp"

namespace gmm::test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Sizes [5, 0, 7, 6] of 4 local experts over M = 20 rows (rows 18, 19 owned by none), row
// tiles of 4 so that groups share tiles.
const std::vector<std::int32_t> kSizes{5, 0, 7, 6};
constexpr std::int64_t kM = 20, kK = 12, kN = 10;

Options v1(int threads) {
  Options o;
  o.family = Family::v1;
  o.tiles = {4, 8, 4};
  o.threads = threads;
  return o;
}

// Checks that out[r, c] is NaN exactly where expected(r, c) says.
template <typename Expected>
::testing::AssertionResult nan_exactly_where(const OwnedOutput& out, Expected&& expected) {
  for (std::int64_t g = 0; g < out.groups; ++g) {
    for (std::int64_t r = 0; r < out.rows; ++r) {
      for (std::int64_t c = 0; c < out.cols; ++c) {
        if (std::isnan(out.at(g, r, c)) != expected(g, r, c)) {
          return ::testing::AssertionFailure()
                 << "out[" << g << "," << r << "," << c << "] = " << out.at(g, r, c);
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// A weight dtype and scale block in which to plant a NaN.
struct WeightCase {
  std::string name;
  DType dtype;
  BlockShape block;
};

TEST(V1NanIsolation, NaNInOneExpertsWeightsStaysInItsRows) {
  const WeightCase cases[] = {{"f32", DType::f32, {}},
                              {"bf16", DType::bf16, {}},
                              {"e4m3 per-channel", DType::float8_e4m3fn, {1, 0, 1}},
                              {"e5m2 4x2 blocks", DType::float8_e5m2, {1, 4, 2}}};
  Rng rng(31);
  for (const WeightCase& w : cases) {
    for (const bool transpose : {false, true}) {
      for (const bool accumulate : {false, true}) {
        SCOPED_TRACE(w.name + (transpose ? " transpose_rhs" : "") +
                     (accumulate ? " accumulate" : ""));
        OwnedMatrix x = random_matrix(rng, DType::bf16, kM, kK);
        OwnedMatrix weights = transpose
                                  ? random_grouped(rng, w.dtype, 4, kN, kK,
                                                   {w.block.groups, w.block.cols, w.block.rows})
                                  : random_grouped(rng, w.dtype, 4, kK, kN, w.block);
        // Expert 2 (rows [5, 12)) gets a NaN at W[k = 3, n = 1].
        if (transpose) {
          weights.set(2, 1, 3, kNaN);
        } else {
          weights.set(2, 3, 1, kNaN);
        }
        const OwnedOutput before = random_output(rng, DType::f32, 1, kM, kN);
        Options options = v1(3);
        options.transpose_rhs = transpose;
        options.accumulate = accumulate;
        OwnedOutput out;
        EXPECT_TRUE(check_gmm(x.view(), weights.grouped_view(), kSizes, before, options, &out));
        EXPECT_TRUE(nan_exactly_where(out, [](std::int64_t, std::int64_t r, std::int64_t c) {
          return r >= 5 && r < 12 && c == 1;
        }));
      }
    }
  }
}

TEST(V1NanIsolation, NaNInOneGroupsRowStaysInThatRow) {
  Rng rng(32);
  const std::optional<QuantSpec> quantizations[] = {
      std::nullopt, QuantSpec{QType::float8_e4m3fn, Calibration::absmax(), 4},
      QuantSpec{QType::float8_e5m2, Calibration::fixed(8.0f), 0}};
  for (const auto& quantize : quantizations) {
    SCOPED_TRACE(quantize ? fmt::format("quantize_lhs {}", quantize->qtype) : "f32");
    OwnedMatrix x = random_matrix(rng, DType::f32, kM, kK);
    x.set(0, 12, 6, kNaN);  // row 12: first row of expert 3, in a tile shared with expert 2
    x.set(0, 19, 0, kNaN);  // row 19 belongs to no group: it must not show up at all
    OwnedMatrix weights = random_grouped(rng, DType::float8_e4m3fn, 4, kK, kN, {1, 0, 1});
    Options options = v1(2);
    options.quantize_lhs = quantize;
    OwnedOutput out;
    EXPECT_TRUE(check_gmm(x.view(), weights.grouped_view(), kSizes,
                          make_output(DType::bf16, 1, kM, kN, 1.0f), options, &out));
    EXPECT_TRUE(
        nan_exactly_where(out, [](std::int64_t, std::int64_t r, std::int64_t) { return r == 12; }));
  }
}

TEST(V1NanIsolation, TgmmNaNInOneGroupsRowsStaysInItsBlock) {
  Rng rng(33);
  // Quantization blocks of 4 rows along M; group boundaries at 4, 12 and 16 are block-aligned
  // so that a NaN scale cannot spill into a neighbouring group's rows.
  const std::vector<std::int32_t> sizes{4, 0, 8, 4};
  const std::optional<QuantSpec> quantizations[] = {
      std::nullopt, QuantSpec{QType::float8_e4m3fn, Calibration::absmax(), 4}};
  for (const auto& quantize : quantizations) {
    for (const bool in_lhs : {true, false}) {
      SCOPED_TRACE(std::string(quantize ? "quantized " : "f32 ") + (in_lhs ? "lhs" : "rhs"));
      OwnedMatrix x = random_matrix(rng, DType::f32, kM, kK);
      OwnedMatrix dy = random_matrix(rng, DType::bf16, kM, kN);
      if (in_lhs) {
        x.set(0, 9, 5, kNaN);   // group 2, column k = 5
        x.set(0, 18, 2, kNaN);  // no group
      } else {
        dy.set(0, 9, 7, kNaN);  // group 2, column n = 7
        dy.set(0, 19, 1, kNaN);
      }
      Options options = v1(3);
      options.quantize_lhs = quantize;
      options.quantize_rhs = quantize;
      OwnedOutput out;
      EXPECT_TRUE(check_tgmm(x.view(), dy.view(), sizes, make_output(DType::f32, 4, kK, kN, 2.0f),
                             options, &out));
      EXPECT_TRUE(nan_exactly_where(out, [&](std::int64_t g, std::int64_t k, std::int64_t n) {
        return g == 2 && (in_lhs ? k == 5 : n == 7);
      }));
    }
  }
}

}  // namespace
}  // namespace gmm::test
