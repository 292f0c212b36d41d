// gmm::quantize / gmm::dequantize against Qwix golden vectors, their errors, and invariances.
#include "gmm/core/quantize.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/golden.hpp"

namespace gmm::test {
namespace {

QType parse_qtype(const std::string& s) {
  return s == "float8_e4m3fn" ? QType::float8_e4m3fn
         : s == "float8_e5m2" ? QType::float8_e5m2
                              : QType::int8;
}

// One record of tests/data/qwix_quantize.txt: an input and what Qwix made of it.
struct QwixCase {
  std::string name;
  QType qtype = QType::float8_e4m3fn;
  Calibration calibration;
  bool bf16 = false;
  int rank = 2;
  std::int64_t groups = 1, rows = 0, cols = 0;
  BlockShape block;
  std::vector<float> x32;
  std::vector<bfloat16> x16;
  std::vector<std::uint32_t> scale;  // fp32 bits
  std::vector<std::uint32_t> q;      // bytes
  std::vector<std::uint32_t> deq;    // fp32 bits

  GroupedMatrix grouped() const {
    const void* data = bf16 ? static_cast<const void*>(x16.data()) : x32.data();
    return {data, bf16 ? DType::bf16 : DType::f32, groups, rows, cols, rows * cols, cols, {}};
  }
  Matrix matrix() const {
    const void* data = bf16 ? static_cast<const void*>(x16.data()) : x32.data();
    return {data, bf16 ? DType::bf16 : DType::f32, rows, cols, cols, {}};
  }
  QArray quantize_as_qwix(int threads = 1) const {
    return rank == 2 ? quantize(matrix(), qtype, block, calibration, threads)
                     : quantize(grouped(), qtype, block, calibration, threads);
  }
};

const std::vector<QwixCase>& qwix_cases() {
  static const std::vector<QwixCase> cases = [] {
    std::vector<QwixCase> out;
    const auto records = golden_records("qwix_quantize.txt");
    for (std::size_t i = 0; i + 4 < records.size(); i += 5) {
      const auto& h = records[i];
      EXPECT_EQ(h[0], "case");
      QwixCase c;
      c.name = h[1];
      c.qtype = parse_qtype(h[2]);
      c.calibration = Calibration::parse(h[3]);
      c.bf16 = h[4] == "bf16";
      c.rank = std::stoi(h[5]);
      c.groups = std::stoll(h[6]);
      c.rows = std::stoll(h[7]);
      c.cols = std::stoll(h[8]);
      c.block = {std::stoll(h[9]), std::stoll(h[10]), std::stoll(h[11])};
      const auto x = parse_hex_words(records[i + 1][1], c.bf16 ? 2 : 4);
      for (std::uint32_t w : x) {
        if (c.bf16) {
          c.x16.push_back(Eigen::numext::bit_cast<bfloat16>(static_cast<std::uint16_t>(w)));
        } else {
          c.x32.push_back(from_bits32(w));
        }
      }
      c.scale = parse_hex_words(records[i + 2][1], 4);
      c.q = parse_hex_words(records[i + 3][1], 1);
      c.deq = parse_hex_words(records[i + 4][1], 4);
      out.push_back(std::move(c));
    }
    return out;
  }();
  return cases;
}

bool is_nan_code(std::uint32_t code, QType qtype) {
  return std::isnan(detail::dequantize_value(static_cast<std::uint8_t>(code), qtype));
}

// Bitwise equality, any NaN matching any NaN (Qwix and gmm may pick different NaN encodings).
::testing::AssertionResult same_f32(float got, std::uint32_t want) {
  if (std::isnan(got) && std::isnan(from_bits32(want))) return ::testing::AssertionSuccess();
  if (bits32(got) == want) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << fmt::format("got {} ({:#010x}), want {} ({:#010x})", got,
                                                      bits32(got), from_bits32(want), want);
}

void expect_matches_qwix(const QwixCase& c, const QArray& q) {
  ASSERT_EQ(q.block, c.block) << c.name;
  ASSERT_EQ(q.scale.size(), c.scale.size()) << c.name;
  ASSERT_EQ(q.qvalue.size(), c.q.size()) << c.name;
  int failures = 0;
  for (std::size_t i = 0; i < c.scale.size() && failures < 5; ++i) {
    const auto ok = same_f32(q.scale[i], c.scale[i]);
    failures += !ok;
    EXPECT_TRUE(ok) << c.name << " scale[" << i << "]";
  }
  for (std::size_t i = 0; i < c.q.size() && failures < 5; ++i) {
    const bool ok = q.qvalue[i] == c.q[i] ||
                    (is_nan_code(q.qvalue[i], c.qtype) && is_nan_code(c.q[i], c.qtype));
    failures += !ok;
    EXPECT_TRUE(ok) << c.name
                    << fmt::format(" q[{}] = {:#04x}, Qwix {:#04x}", i, q.qvalue[i], c.q[i]);
  }
}

TEST(QwixGolden, HasEveryKindOfCase) {
  const auto& cases = qwix_cases();
  EXPECT_GE(cases.size(), 300u);
  int fixed = 0, bf16 = 0, int8 = 0, e5m2 = 0;
  for (const auto& c : cases) {
    fixed += c.calibration.method == Calibration::Method::fixed;
    bf16 += c.bf16;
    int8 += c.qtype == QType::int8;
    e5m2 += c.qtype == QType::float8_e5m2;
  }
  EXPECT_GT(fixed, 20);
  EXPECT_GT(bf16, 20);
  EXPECT_GT(int8, 50);
  EXPECT_GT(e5m2, 50);
}

TEST(QwixGolden, QuantizeReproducesQwixScalesAndQvalues) {
  for (const auto& c : qwix_cases()) expect_matches_qwix(c, c.quantize_as_qwix());
}

TEST(QwixGolden, DequantizeReproducesQwix) {
  for (const auto& c : qwix_cases()) {
    const std::vector<float> deq = dequantize(c.quantize_as_qwix());
    ASSERT_EQ(deq.size(), c.deq.size());
    int failures = 0;
    for (std::size_t i = 0; i < deq.size() && failures < 5; ++i) {
      const auto ok = same_f32(deq[i], c.deq[i]);
      failures += !ok;
      EXPECT_TRUE(ok) << c.name << " deq[" << i << "]";
    }
  }
}

TEST(QwixGolden, QuantizeIntoAndThreadsGiveTheSameBytes) {
  for (const auto& c : qwix_cases()) {
    const QArray one = c.quantize_as_qwix(1);
    const QArray three = c.quantize_as_qwix(3);
    EXPECT_EQ(one.qvalue, three.qvalue) << c.name;
    EXPECT_EQ(std::memcmp(one.scale.data(), three.scale.data(), one.scale.size() * 4), 0) << c.name;
    std::vector<std::uint8_t> q(c.q.size());
    std::vector<float> s(c.scale.size());
    const BlockShape block =
        c.rank == 2
            ? quantize_into(c.matrix(), c.qtype, c.block, c.calibration, q.data(), s.data(), 2)
            : quantize_into(c.grouped(), c.qtype, c.block, c.calibration, q.data(), s.data(), 2);
    EXPECT_EQ(block, c.block);
    EXPECT_EQ(q, one.qvalue) << c.name;
    EXPECT_EQ(std::memcmp(s.data(), one.scale.data(), s.size() * 4), 0) << c.name;
  }
}

// Qwix's quantize_with_scale_zero_point with Qwix's own scales gives Qwix's qvalues.
TEST(QwixGolden, QuantizeWithQwixScalesGivesQwixQvalues) {
  int checked = 0;
  for (const auto& c : qwix_cases()) {
    std::vector<float> scales(c.scale.size());
    bool usable = true;
    for (std::size_t i = 0; i < scales.size(); ++i) {
      scales[i] = from_bits32(c.scale[i]);
      usable = usable && std::isfinite(scales[i]);
    }
    if (!usable) continue;  // NaN / inf scales are refused; covered by ErrorsTest
    const ScaleArray array{scales.data(), c.groups / c.block.groups, c.rows / c.block.rows,
                           c.cols / c.block.cols};
    expect_matches_qwix(c, quantize_with_scales(c.grouped(), c.qtype, array));
    ++checked;
  }
  EXPECT_GT(checked, 200);
}

TEST(QwixGolden, ViewDequantizeToBf16RoundsTheFp32ValueOnce) {
  for (const auto& c : qwix_cases()) {
    const QArray q = c.quantize_as_qwix();
    std::vector<bfloat16> out(q.qvalue.size());
    dequantize(q.grouped(), OutGroupedMatrix{out.data(), DType::bf16, q.groups, q.rows, q.cols,
                                             q.rows * q.cols, q.cols});
    for (std::size_t i = 0; i < out.size(); ++i) {
      const float want = static_cast<float>(bfloat16(from_bits32(c.deq[i])));
      EXPECT_TRUE(same_f32(static_cast<float>(out[i]), bits32(want))) << c.name << " " << i;
    }
  }
}

// ---- Properties beyond the golden vectors ---------------------------------------------------

std::vector<float> random_values(std::size_t n, std::uint32_t seed, float spread = 4.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(Quantize, NamedBlocksResolveAgainstTheShape) {
  const std::vector<float> w = random_values(3 * 8 * 6, 1);
  const GroupedMatrix view = grouped_view(w.data(), 3, 8, 6);
  const QType e4 = QType::float8_e4m3fn;
  EXPECT_EQ(quantize(view, e4, blocks::per_tensor).block, (BlockShape{3, 8, 6}));
  EXPECT_EQ(quantize(view, e4, blocks::per_row).block, (BlockShape{1, 1, 6}));
  EXPECT_EQ(quantize(view, e4, blocks::per_column).block, (BlockShape{1, 8, 1}));
  EXPECT_EQ(quantize(view, e4, blocks::per_column_shared).block, (BlockShape{3, 8, 1}));
  EXPECT_EQ(quantize(view, e4, blocks::tile(4, 3)).block, (BlockShape{1, 4, 3}));
  EXPECT_EQ(quantize(view, e4, blocks::per_column).scale.size(), 3u * 6u);
  EXPECT_EQ(quantize(view, e4, blocks::per_column_shared).scale.size(), 6u);
  // fixed calibration is per tensor whatever the block says, as in Qwix.
  const QArray fixed = quantize(view, e4, blocks::per_row, Calibration::parse("fixed,-224,224"));
  EXPECT_EQ(fixed.block, (BlockShape{3, 8, 6}));
  ASSERT_EQ(fixed.scale.size(), 1u);
  EXPECT_EQ(fixed.scale[0], 0.5f);
}

TEST(Quantize, StridedInputEqualsDenseInput) {
  const std::int64_t rows = 6, cols = 40, stride = 53;
  const std::vector<float> padded = random_values(rows * stride, 2);
  std::vector<float> dense(rows * cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) dense[r * cols + c] = padded[r * stride + c];
  }
  const QArray a =
      quantize(view(padded.data(), rows, cols, stride), QType::float8_e5m2, blocks::tile(1, 8));
  const QArray b = quantize(view(dense.data(), rows, cols), QType::float8_e5m2, blocks::tile(1, 8));
  EXPECT_EQ(a.qvalue, b.qvalue);
  EXPECT_EQ(a.scale, b.scale);
}

// The element rule is the one every quantizer shares (core/qvalue.hpp).
TEST(Quantize, UsesTheSharedElementRule) {
  const std::vector<float> x = random_values(16 * 32, 3, 100.0f);
  for (QType qtype : {QType::float8_e4m3fn, QType::float8_e5m2, QType::int8}) {
    const QArray q = quantize(view(x.data(), 16, 32), qtype, blocks::tile(1, 8));
    for (std::int64_t r = 0; r < 16; ++r) {
      for (std::int64_t b = 0; b < 4; ++b) {
        float absmax = 0.0f;
        for (std::int64_t c = 8 * b; c < 8 * b + 8; ++c) {
          absmax = detail::absmax_update(absmax, x[r * 32 + c]);
        }
        const float scale = detail::absmax_scale(absmax, qtype);
        EXPECT_EQ(q.scale[r * 4 + b], scale);
        for (std::int64_t c = 8 * b; c < 8 * b + 8; ++c) {
          EXPECT_EQ(q.qvalue[r * 32 + c], detail::quantize_value(x[r * 32 + c], scale, qtype));
        }
      }
    }
  }
}

TEST(Quantize, Int8StaysInTheSymmetricRange) {
  std::vector<float> x = random_values(64 * 16, 4);
  x[5] = -1e30f;
  x[77] = 1e30f;
  const QArray q = quantize(view(x.data(), 64, 16), QType::int8, blocks::per_tensor,
                            Calibration::parse("fixed,1"));
  int saturated = 0;
  for (std::uint8_t b : q.qvalue) {
    const auto v = static_cast<std::int8_t>(b);
    EXPECT_GE(v, -127);
    EXPECT_LE(v, 127);
    saturated += v == -127 || v == 127;
  }
  EXPECT_GT(saturated, 2);
}

TEST(Quantize, EmptyTensorsAreFine) {
  const QArray q = quantize(view(static_cast<const float*>(nullptr), 0, 8), QType::float8_e4m3fn,
                            blocks::per_row);
  EXPECT_TRUE(q.qvalue.empty());
  EXPECT_TRUE(q.scale.empty());
  EXPECT_TRUE(dequantize(q).empty());
}

// ---- Errors -----------------------------------------------------------------------------------

// Runs f, expecting a gmm::Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "no gmm::Error thrown";
  } catch (const Error& e) {
    for (const char* part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << part << "\"";
    }
  }
}

TEST(QuantizeErrors, BlockExtentThatDoesNotDivideItsAxis) {
  const std::vector<float> x = random_values(8 * 12, 5);
  const Matrix m = view(x.data(), 8, 12);
  expect_error([&] { quantize(m, QType::float8_e4m3fn, blocks::tile(1, 5)); },
               {"gmm::quantize", "x scale block along cols", "a positive divisor of 12", "got 5"});
  expect_error([&] { quantize(m, QType::float8_e4m3fn, blocks::tile(3, 4)); },
               {"x scale block along rows", "divisor of 8", "got 3"});
  expect_error(
      [&] {
        quantize(m, QType::float8_e4m3fn, BlockShape{1, -1, 4});
      },
      {"block extent along rows", "got -1"});
  expect_error(
      [&] {
        quantize(m, QType::float8_e4m3fn, BlockShape{2, 1, 4});
      },
      {"block extent along groups", "0 or 1 for a 2-D operand", "got 2"});
  const GroupedMatrix g = grouped_view(x.data(), 3, 4, 8);
  expect_error(
      [&] {
        quantize(g, QType::int8, BlockShape{2, 1, 8});
      },
      {"x scale block along groups", "divisor of 3", "got 2"});
}

TEST(QuantizeErrors, FixedCalibrationStrings) {
  expect_error([] { Calibration::parse("fixed,-200,224"); },
               {"fixed bounds", "symmetric bounds -MAX,MAX", "fixed,-200,224"});
  for (const char* bad : {"fixed", "fixed,", "fixed,abc", "fixed,1,2,3", "fixd,1", "absmax,0.9",
                          "fixed,nan", "fixed,inf", "fixed,-inf,inf", "fixed, 448", "fixed,448 ",
                          "fixed,-224, 224", "fixed,\t448", " absmax", "absmax "}) {
    expect_error([&] { Calibration::parse(bad); }, {"gmm::Calibration::parse", bad});
  }
  for (const char* bad : {"fixed,0", "fixed,-5", "fixed,-0,0"}) {
    expect_error([&] { Calibration::parse(bad); }, {"MAX", "a finite positive bound"});
  }
  EXPECT_EQ(Calibration::parse("fixed,-224,224").bound, 224.0f);
  EXPECT_EQ(Calibration::parse("fixed,448").static_scale(QType::float8_e4m3fn), 1.0f);
  EXPECT_EQ(Calibration::parse("absmax").method, Calibration::Method::absmax);
}

TEST(QuantizeErrors, StaticScaleBelowSqrtFltMin) {
  const std::vector<float> x = random_values(4 * 4, 6);
  // sqrt(FLT_MIN) ~ 1.08e-19: 3e-17 / 448 is below it, 3e-17 / 127 is not.
  const Calibration tiny = Calibration::parse("fixed,3e-17");
  expect_error(
      [&] { quantize(view(x.data(), 4, 4), QType::float8_e4m3fn, blocks::per_tensor, tiny); },
      {"fixed scale MAX / qmax", "at least sqrt(FLT_MIN)"});
  EXPECT_NO_THROW(quantize(view(x.data(), 4, 4), QType::int8, blocks::per_tensor, tiny));
}

TEST(QuantizeErrors, InputThatCannotBeQuantized) {
  std::vector<float8_e4m3fn> q(16);
  const float one = 1.0f;
  expect_error(
      [&] {
        quantize(Matrix{q.data(), DType::float8_e4m3fn, 4, 4, 4, {&one, {1, 4, 4}}},
                 QType::float8_e4m3fn, blocks::per_tensor);
      },
      {"x dtype", "f32 or bf16", "float8_e4m3fn"});
}

TEST(QuantizeErrors, NothingIsWrittenWhenQuantizeIntoThrows) {
  const std::vector<float> x = random_values(8 * 12, 7);
  std::vector<std::uint8_t> q(x.size(), 0xAB);
  std::vector<float> s(8, -3.0f);
  EXPECT_THROW(quantize_into(view(x.data(), 8, 12), QType::float8_e4m3fn, blocks::tile(1, 5),
                             Calibration::absmax(), q.data(), s.data()),
               Error);
  for (std::uint8_t b : q) EXPECT_EQ(b, 0xAB);
  for (float v : s) EXPECT_EQ(v, -3.0f);
}

TEST(QuantizeErrors, ProvidedScales) {
  const std::vector<float> x = random_values(2 * 8 * 6, 8);
  const GroupedMatrix g = grouped_view(x.data(), 2, 8, 6);
  std::vector<float> s(2 * 6, 0.25f);
  expect_error(
      [&] {
        quantize_with_scales(g, QType::float8_e4m3fn, {s.data(), 2, 1, 4});
      },
      {"scale shape", "dividing the shape of x [2, 8, 6]", "[2, 1, 4]"});
  s[7] = NAN;
  expect_error(
      [&] {
        quantize_with_scales(g, QType::float8_e4m3fn, {s.data(), 2, 1, 6});
      },
      {"scale[7]", "a finite positive value", "nan"});
  s[7] = INFINITY;
  expect_error(
      [&] {
        quantize_with_scales(g, QType::float8_e4m3fn, {s.data(), 2, 1, 6});
      },
      {"scale[7]", "inf"});
  s[7] = 0.0f;
  expect_error(
      [&] {
        quantize_with_scales(g, QType::float8_e4m3fn, {s.data(), 2, 1, 6});
      },
      {"scale[7]", "got 0"});
}

TEST(QuantizeErrors, DequantizeChecksScalesAndShapes) {
  const std::vector<float> x = random_values(4 * 8, 9);
  QArray q = quantize(view(x.data(), 4, 8), QType::float8_e4m3fn, blocks::per_row);
  std::vector<float> x_out(4 * 8);
  QArray short_scales = q;
  short_scales.scale.pop_back();
  expect_error([&] { dequantize(short_scales); },
               {"gmm::dequantize", "scale size", "4 (one per 1x1x8 block of [1, 4, 8])", "got 3"});
  QArray bad_block = q;
  bad_block.block = {1, 3, 8};
  expect_error([&] { dequantize(bad_block); }, {"q scale block along rows", "got 3"});
  Matrix no_scales = q.matrix();
  no_scales.scales.data = nullptr;
  expect_error([&] { dequantize(no_scales, out_view(x_out.data(), 4, 8)); },
               {"q scales", "an fp32 scale array", "none"});
  QArray short_values = q;
  short_values.qvalue.resize(5);
  expect_error([&] { dequantize(short_values); }, {"qvalue size", "32", "got 5"});

  std::vector<float> out(4 * 8, 7.0f);
  expect_error([&] { dequantize(q.matrix(), out_view(out.data(), 4, 7)); },
               {"out shape", "[1, 4, 8]", "[1, 4, 7]"});
  expect_error([&] { dequantize(view(x.data(), 4, 8), out_view(out.data(), 4, 8)); },
               {"q dtype", "f32"});
  for (float v : out) EXPECT_EQ(v, 7.0f);
}

}  // namespace
}  // namespace gmm::test
