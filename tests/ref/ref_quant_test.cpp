// The oracle on quantized operands: every scale granularity equals dequantize-then-dense math,
// and quantize_lhs / quantize_rhs equal gmm::quantize followed by the oracle.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gmm/core/quantize.hpp"
#include "gmm/ref/reference.hpp"
#include "support/compare.hpp"
#include "support/operands.hpp"

namespace gmm::test {
namespace {

// Dense fp64 values of a (grouped) quantized operand, built block by block: the scales are
// read in storage order while walking the blocks, independently of the oracle's indexing.
std::vector<double> dequantized(const OwnedMatrix& x) {
  std::vector<double> d(static_cast<std::size_t>(x.groups * x.rows * x.cols));
  std::size_t next_scale = 0;
  for (std::int64_t g0 = 0; g0 < x.groups; g0 += x.block.groups) {
    for (std::int64_t r0 = 0; r0 < x.rows; r0 += x.block.rows) {
      for (std::int64_t c0 = 0; c0 < x.cols; c0 += x.block.cols) {
        const double s = x.scales.empty() ? 1.0 : x.scales[next_scale++];
        for (std::int64_t g = g0; g < g0 + x.block.groups; ++g) {
          for (std::int64_t r = r0; r < r0 + x.block.rows; ++r) {
            for (std::int64_t c = c0; c < c0 + x.block.cols; ++c) {
              d[(g * x.rows + r) * x.cols + c] = static_cast<double>(x.stored(g, r, c)) * s;
            }
          }
        }
      }
    }
  }
  return d;
}

// A named scale block shape of one test case.
struct Granularity {
  std::string name;
  BlockShape block;  // 0 extents: the whole axis
};

::testing::AssertionResult near(const OwnedOutput& got, const std::vector<double>& value,
                                const std::vector<double>& magnitude, std::int64_t terms) {
  for (std::int64_t g = 0; g < got.groups; ++g) {
    for (std::int64_t r = 0; r < got.rows; ++r) {
      for (std::int64_t c = 0; c < got.cols; ++c) {
        const std::size_t i = static_cast<std::size_t>((g * got.rows + r) * got.cols + c);
        const double bound = 0x1p-24 * std::fabs(value[i]) + terms * 0x1p-52 * magnitude[i];
        if (!(std::fabs(got.at(g, r, c) - value[i]) <= bound)) {
          return ::testing::AssertionFailure()
                 << "out[" << g << "," << r << "," << c << "] = " << got.at(g, r, c)
                 << ", dense math " << value[i] << " +- " << bound;
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(RefQuantized, GmmEveryGranularityEqualsDequantizedDenseMath) {
  Rng rng(21);
  const std::int64_t m = 8, k = 12, n = 6, groups = 2;
  const std::vector<std::int32_t> sizes{3, 5};
  const std::vector<Granularity> activations{
      {"per-tensor", {0, 0, 0}}, {"per-row", {1, 1, 0}}, {"1x4", {1, 1, 4}}, {"2x2", {1, 2, 2}}};
  const std::vector<Granularity> weights{{"per-tensor", {0, 0, 0}},
                                         {"per-channel per expert", {1, 0, 1}},
                                         {"per-channel shared", {0, 0, 1}},
                                         {"4x3 blocks", {1, 4, 3}},
                                         {"12x2 blocks shared", {0, 12, 2}}};
  const DType types[] = {DType::float8_e4m3fn, DType::float8_e5m2, DType::int8};
  int combo = 0;
  for (const Granularity& a : activations) {
    for (const Granularity& w : weights) {
      for (const bool transpose : {false, true}) {
        SCOPED_TRACE(a.name + " x " + w.name + (transpose ? " (transpose_rhs)" : ""));
        const DType lhs_type = types[combo % 3], rhs_type = types[(combo / 3) % 3];
        ++combo;
        OwnedMatrix x = random_matrix(rng, lhs_type, m, k, a.block);
        // Transposed weights are stored [G, N, K]: the block extents swap their axes.
        const BlockShape wb =
            transpose ? BlockShape{w.block.groups, w.block.cols, w.block.rows} : w.block;
        OwnedMatrix wq = transpose ? random_grouped(rng, rhs_type, groups, n, k, wb)
                                   : random_grouped(rng, rhs_type, groups, k, n, wb);
        Options options;
        options.transpose_rhs = transpose;
        OwnedOutput out = make_output(DType::f32, 1, m, n, 0.0f);
        ref::gmm(x.view(), wq.grouped_view(), sizes, out.view(), options);
        const std::vector<double> dx = dequantized(x), dw = dequantized(wq);
        std::vector<double> value(m * n, 0.0), magnitude(m * n, 0.0);
        std::int64_t row = 0;
        for (std::int64_t g = 0; g < groups; ++g) {
          for (std::int64_t i = 0; i < sizes[g]; ++i, ++row) {
            for (std::int64_t c = 0; c < n; ++c) {
              for (std::int64_t kk = 0; kk < k; ++kk) {
                const double wv = transpose ? dw[(g * n + c) * k + kk] : dw[(g * k + kk) * n + c];
                value[row * n + c] += dx[row * k + kk] * wv;
                magnitude[row * n + c] += std::fabs(dx[row * k + kk] * wv);
              }
            }
          }
        }
        EXPECT_TRUE(near(out, value, magnitude, k));
      }
    }
  }
}

TEST(RefQuantized, TgmmEveryGranularityEqualsDequantizedDenseMath) {
  Rng rng(22);
  const std::int64_t m = 12, k = 5, n = 4;
  const std::vector<std::int32_t> sizes{5, 0, 6};
  const std::vector<Granularity> grains{{"per-tensor", {0, 0, 0}},
                                        {"per-column", {1, 0, 1}},
                                        {"4x1 blocks", {1, 4, 1}},
                                        {"3 x all columns", {1, 3, 0}},
                                        {"per-row", {1, 1, 0}}};
  const DType types[] = {DType::float8_e4m3fn, DType::float8_e5m2, DType::int8};
  int combo = 0;
  for (const Granularity& a : grains) {
    for (const Granularity& b : grains) {
      SCOPED_TRACE(a.name + " x " + b.name);
      OwnedMatrix x = random_matrix(rng, types[combo % 3], m, k, a.block);
      OwnedMatrix dy = random_matrix(rng, types[(combo / 3) % 3], m, n, b.block);
      ++combo;
      OwnedOutput out = make_output(DType::f32, 3, k, n, 0.0f);
      ref::tgmm(x.view(), dy.view(), sizes, out.grouped_view());
      const std::vector<double> dx = dequantized(x), ddy = dequantized(dy);
      std::vector<double> value(3 * k * n, 0.0), magnitude(3 * k * n, 0.0);
      std::int64_t row = 0;
      for (std::int64_t g = 0; g < 3; ++g) {
        for (std::int64_t i = 0; i < sizes[g]; ++i, ++row) {
          for (std::int64_t a_col = 0; a_col < k; ++a_col) {
            for (std::int64_t b_col = 0; b_col < n; ++b_col) {
              const double t = dx[row * k + a_col] * ddy[row * n + b_col];
              value[(g * k + a_col) * n + b_col] += t;
              magnitude[(g * k + a_col) * n + b_col] += std::fabs(t);
            }
          }
        }
      }
      EXPECT_TRUE(near(out, value, magnitude, m));
    }
  }
}

// quantize_lhs in the call equals materializing gmm::quantize first (absmax per row x K block,
// or the static scale of fixed calibration), bit for bit.
TEST(RefQuantized, GmmQuantizeLhsEqualsQuantizeThenOracle) {
  Rng rng(23);
  const std::int64_t m = 7, k = 16, n = 5;
  OwnedMatrix x = random_matrix(rng, DType::bf16, m, k, {}, 3);
  x.set(0, 2, 5, 0.0f);
  for (std::int64_t c = 0; c < 8; ++c) x.set(0, 4, c, 0.0f);  // an all-zero block: scale 1
  OwnedMatrix w = random_grouped(rng, DType::float8_e4m3fn, 2, k, n, {1, 0, 1});
  const std::vector<std::int32_t> sizes{2, 4};
  const QuantSpec specs[] = {{QType::float8_e4m3fn, Calibration::absmax(), 8},
                             {QType::float8_e5m2, Calibration::absmax(), 0},
                             {QType::int8, Calibration::absmax(), 4},
                             {QType::float8_e4m3fn, Calibration::parse("fixed,-3,3"), 8},
                             {QType::int8, Calibration::fixed(2.0f), 4}};
  for (const QuantSpec& spec : specs) {
    SCOPED_TRACE(
        fmt::format("{} {} block {}", spec.qtype, spec.calibration.to_string(), spec.block));
    Options options;
    options.quantize_lhs = spec;
    OwnedOutput in_call = make_output(DType::f32, 1, m, n, 0.0f);
    ref::gmm(x.view(), w.grouped_view(), sizes, in_call.view(), options);
    const QArray q = quantize(x.view(), spec.qtype, blocks::tile(1, spec.block), spec.calibration);
    OwnedOutput materialized = make_output(DType::f32, 1, m, n, 0.0f);
    ref::gmm(q.matrix(), w.grouped_view(), sizes, materialized.view());
    EXPECT_TRUE(same_bits(in_call, materialized));
  }
}

TEST(RefQuantized, TgmmQuantizeBothOperandsEqualsQuantizeThenOracle) {
  Rng rng(24);
  const std::int64_t m = 12, k = 3, n = 4;
  OwnedMatrix x = random_matrix(rng, DType::f32, m, k);
  OwnedMatrix dy = random_matrix(rng, DType::bf16, m, n, {}, 5);
  const std::vector<std::int32_t> sizes{4, 0, 7};
  const QuantSpec lhs_spec{QType::float8_e4m3fn, Calibration::absmax(), 4};
  const QuantSpec rhs_spec{QType::float8_e5m2, Calibration::absmax(), 6};
  Options options;
  options.quantize_lhs = lhs_spec;
  options.quantize_rhs = rhs_spec;
  OwnedOutput in_call = make_output(DType::bf16, 3, k, n, 0.0f);
  ref::tgmm(x.view(), dy.view(), sizes, in_call.grouped_view(), options);
  const QArray qx = quantize(x.view(), lhs_spec.qtype, blocks::tile(4, 1), lhs_spec.calibration);
  const QArray qdy = quantize(dy.view(), rhs_spec.qtype, blocks::tile(6, 1), rhs_spec.calibration);
  OwnedOutput materialized = make_output(DType::bf16, 3, k, n, 0.0f);
  ref::tgmm(qx.matrix(), qdy.matrix(), sizes, materialized.grouped_view());
  EXPECT_TRUE(same_bits(in_call, materialized));
}

}  // namespace
}  // namespace gmm::test
