// fp8 types against ml_dtypes golden vectors: decoding, encoding in every saturation mode,
// limits, buffer conversion and Eigen matrices.
#include "gmm/core/fp8.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/fp8_runs.hpp"
#include "core/golden.hpp"
#include "gmm/core/dtype.hpp"

namespace gmm::test {
namespace {

template <typename T>
class Fp8Test : public ::testing::Test {};
TYPED_TEST_SUITE(Fp8Test, Fp8Types, Fp8TypeNames);

// Compares an encode result with a golden result (a code, or "any NaN").
template <typename T>
::testing::AssertionResult encodes_as(T got, int expected) {
  const bool got_nan = std::isnan(static_cast<float>(got));
  if (expected == kAnyNan ? got_nan : got.bits() == expected) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "got 0x" << std::hex << int{got.bits()} << ", expected "
         << (expected == kAnyNan ? std::string("a NaN") : "0x" + std::to_string(expected));
}

TYPED_TEST(Fp8Test, DecodesEveryCodeLikeMlDtypes) {
  using T = TypeParam;
  int checked = 0;
  for (const auto& r : golden_records("fp8_decode.txt")) {
    if (r[0] != fp8_name<T>()) continue;
    const auto code = static_cast<std::uint8_t>(parse_hex(r[1]));
    const float expected = from_bits32(parse_hex(r[2]));
    const float got = static_cast<float>(T::from_bits(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << int{code};
    } else {
      EXPECT_EQ(bits32(got), bits32(expected)) << "code " << int{code};
    }
    T in = T::from_bits(code);
    float f32 = 0.0f;
    bfloat16 b16;
    fp8_decode(&in, &f32, 1);
    fp8_decode(&in, &b16, 1);
    EXPECT_EQ(bits32(f32), bits32(got)) << "buffer decode of code " << int{code};
    const std::uint32_t expected_b16 = parse_hex(r[3]);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(b16))) << "code " << int{code};
    } else {
      EXPECT_EQ(Eigen::numext::bit_cast<std::uint16_t>(b16), expected_b16) << "code " << int{code};
    }
    ++checked;
  }
  EXPECT_EQ(checked, 256);
}

TYPED_TEST(Fp8Test, LimitsMatchMlDtypesFinfo) {
  using T = TypeParam;
  using L = std::numeric_limits<T>;
  int checked = 0;
  for (const auto& r : golden_records("fp8_limits.txt")) {
    if (r[0] != fp8_name<T>()) continue;
    const std::string& field = r[1];
    ++checked;
    if (field == "digits") {
      EXPECT_EQ(L::digits, std::stoi(r[2]));
    } else if (field == "max_exponent") {
      EXPECT_EQ(L::max_exponent, std::stoi(r[2]));
    } else if (field == "min_exponent") {
      EXPECT_EQ(L::min_exponent, std::stoi(r[2]));
    } else {
      const float expected = from_bits32(parse_hex(r[2]));
      const T got = field == "max"                  ? L::max()
                    : field == "min"                ? L::lowest()
                    : field == "tiny"               ? L::min()
                    : field == "eps"                ? L::epsilon()
                    : field == "smallest_subnormal" ? L::denorm_min()
                                                    : T::from_bits(0);
      EXPECT_EQ(static_cast<float>(got), expected) << field;
    }
  }
  EXPECT_EQ(checked, 8);
  EXPECT_TRUE(std::isnan(static_cast<float>(L::quiet_NaN())));
  EXPECT_EQ(static_cast<float>(L::round_error()), 0.5f);
  if (L::has_infinity) {
    EXPECT_EQ(static_cast<float>(L::infinity()), std::numeric_limits<float>::infinity());
  } else {
    EXPECT_TRUE(std::isnan(static_cast<float>(L::infinity())));  // as ml_dtypes
  }
}

TYPED_TEST(Fp8Test, EncodesTiesOverflowAndSpecialsLikeMlDtypes) {
  using T = TypeParam;
  std::vector<float> inputs;
  std::vector<std::array<int, 3>> expected;
  for (const auto& r : golden_records("fp8_encode_cases.txt")) {
    if (r[0] != fp8_name<T>()) continue;
    inputs.push_back(from_bits32(parse_hex(r[1])));
    expected.push_back({parse_code(r[2]), parse_code(r[3]), parse_code(r[4])});
  }
  ASSERT_GT(inputs.size(), 1000u);
  std::vector<T> buffer(inputs.size());
  for (int m = 0; m < 3; ++m) {
    const Saturation mode = kSaturations[m];
    fp8_encode(inputs.data(), buffer.data(), static_cast<std::int64_t>(inputs.size()), mode);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const int want = expected[i][m];
      EXPECT_TRUE(encodes_as(fp8_cast<T>(inputs[i], mode), want))
          << mode_name(mode) << " input 0x" << std::hex << bits32(inputs[i]);
      EXPECT_TRUE(encodes_as(buffer[i], want))
          << "buffer " << mode_name(mode) << " input 0x" << std::hex << bits32(inputs[i]);
      if (mode == Saturation::none) {
        EXPECT_TRUE(encodes_as(T(inputs[i]), want));
      }
    }
  }
}

// Every run boundary of the all-inputs sweep (so every tie and overflow threshold), its
// neighbours, and a stride through the rest of the fp32 bit patterns.
TYPED_TEST(Fp8Test, EncodesSampledFp32InputsLikeMlDtypes) {
  using T = TypeParam;
  for (Saturation mode : kSaturations) {
    const EncodeRuns runs = load_encode_runs(fp8_name<T>(), mode);
    ASSERT_GT(runs.first_input.size(), 100u);
    std::vector<std::uint32_t> inputs;
    for (std::uint32_t first : runs.first_input) {
      for (std::uint32_t d = 0; d < 3; ++d) inputs.push_back(first + d - 1);
    }
    for (std::uint64_t u = 0; u < (1ull << 32); u += 4099) inputs.push_back(u);
    std::vector<float> x(inputs.size());
    std::vector<T> got(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) x[i] = from_bits32(inputs[i]);
    fp8_encode(x.data(), got.data(), static_cast<std::int64_t>(x.size()), mode);
    int failures = 0;
    for (std::size_t i = 0; i < inputs.size() && failures < 10; ++i) {
      const auto ok = encodes_as(got[i], runs.expected(inputs[i]));
      failures += !ok;
      EXPECT_TRUE(ok) << mode_name(mode) << " input 0x" << std::hex << inputs[i];
      EXPECT_EQ(got[i], fp8_cast<T>(x[i], mode));
    }
  }
}

TYPED_TEST(Fp8Test, EncodesEveryBf16Value) {
  using T = TypeParam;
  std::vector<bfloat16> b16(65536);
  std::vector<float> f32(65536);
  for (std::uint32_t u = 0; u < 65536; ++u) {
    b16[u] = Eigen::numext::bit_cast<bfloat16>(static_cast<std::uint16_t>(u));
    f32[u] = static_cast<float>(b16[u]);
  }
  for (Saturation mode : kSaturations) {
    const EncodeRuns runs = load_encode_runs(fp8_name<T>(), mode);
    std::vector<T> from_b16(65536), from_f32(65536);
    fp8_encode(b16.data(), from_b16.data(), 65536, mode);
    fp8_encode(f32.data(), from_f32.data(), 65536, mode);
    for (std::uint32_t u = 0; u < 65536; ++u) {
      EXPECT_EQ(from_b16[u], from_f32[u]) << "bf16 0x" << std::hex << u;
      EXPECT_TRUE(encodes_as(from_b16[u], runs.expected(u << 16))) << "bf16 0x" << std::hex << u;
    }
  }
}

TYPED_TEST(Fp8Test, DecodeThenEncodeIsIdentity) {
  using T = TypeParam;
  for (int c = 0; c < 256; ++c) {
    const T v = T::from_bits(static_cast<std::uint8_t>(c));
    const float f = static_cast<float>(v);
    if (std::isnan(f)) continue;
    if (std::isinf(f)) {
      EXPECT_EQ(fp8_cast<T>(f, Saturation::none), v);
      EXPECT_EQ(fp8_cast<T>(f, Saturation::finite), v);
      continue;
    }
    for (Saturation mode : kSaturations) EXPECT_EQ(fp8_cast<T>(f, mode), v) << c;
  }
}

TYPED_TEST(Fp8Test, BufferConversionMatchesScalarAtEveryLengthAndOffset) {
  using T = TypeParam;
  std::mt19937 rng(7);
  std::vector<float> x(300);
  for (float& v : x) v = from_bits32(static_cast<std::uint32_t>(rng()));
  for (std::int64_t offset : {0, 1, 3}) {
    for (std::int64_t n : {0, 1, 7, 15, 16, 17, 31, 64, 257}) {
      std::vector<T> q(n + 2, T::from_bits(0xAA));
      fp8_encode(x.data() + offset, q.data() + 1, n, Saturation::finite);
      EXPECT_EQ(q[0].bits(), 0xAA);
      EXPECT_EQ(q[n + 1].bits(), 0xAA) << "wrote past the end, n = " << n;
      std::vector<float> back(n);
      fp8_decode(q.data() + 1, back.data(), n);
      for (std::int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(q[i + 1], fp8_cast<T>(x[offset + i], Saturation::finite));
        const float f = static_cast<float>(q[i + 1]);
        EXPECT_TRUE(std::isnan(f) ? std::isnan(back[i]) : bits32(back[i]) == bits32(f));
      }
    }
  }
}

TYPED_TEST(Fp8Test, EigenMatricesOfFp8Work) {
  using T = TypeParam;
  Eigen::MatrixXf a(3, 4);
  a << 0.0f, 1.0f, -2.5f, 3.0f, 0.1f, -0.0f, 448.0f, 1e-3f, 7.0f, 8.0f, 9.0f, -10.0f;
  const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic> q = a.cast<T>();
  const Eigen::MatrixXf back = q.template cast<float>();
  for (Eigen::Index i = 0; i < a.rows(); ++i) {
    for (Eigen::Index j = 0; j < a.cols(); ++j) {
      EXPECT_EQ(q(i, j), T(a(i, j)));
      EXPECT_EQ(back(i, j), static_cast<float>(T(a(i, j))));
    }
  }
  Eigen::Matrix<T, 2, 2> z;
  z.setZero();
  EXPECT_EQ(z(1, 1).bits(), 0);
  const auto block = q.block(1, 1, 2, 2).eval();
  EXPECT_EQ(block(0, 1), q(1, 2));
  EXPECT_EQ(Eigen::NumTraits<T>::highest(), std::numeric_limits<T>::max());
  EXPECT_EQ(Eigen::NumTraits<T>::lowest(), std::numeric_limits<T>::lowest());
  EXPECT_EQ(Eigen::NumTraits<T>::epsilon(), std::numeric_limits<T>::epsilon());
}

TEST(Fp8, TypesAreOneTriviallyCopyableByte) {
  static_assert(sizeof(float8_e4m3fn) == 1 && sizeof(float8_e5m2) == 1);
  static_assert(std::is_trivially_copyable_v<float8_e4m3fn>);
  static_assert(std::is_trivially_copyable_v<float8_e5m2>);
  EXPECT_EQ(float8_e4m3fn(464.0f).bits(), 0x7E);   // the tie rounds to even: 448
  EXPECT_EQ(float8_e4m3fn(464.01f).bits(), 0x7F);  // rounds above 448: NaN
  EXPECT_EQ(fp8_cast<float8_e4m3fn>(1e9f, Saturation::finite).bits(), 0x7E);
  EXPECT_EQ(fp8_cast<float8_e5m2>(-INFINITY, Saturation::finite).bits(), 0xFC);
  EXPECT_EQ(fp8_cast<float8_e5m2>(-INFINITY, Saturation::all).bits(), 0xFB);
}

}  // namespace
}  // namespace gmm::test
