// Shared by the fp8 tests: the type names of the golden files and the all-inputs encode runs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/golden.hpp"
#include "gmm/core/fp8.hpp"

namespace gmm::test {

// Golden result meaning "any NaN encoding" (ml_dtypes and gmm may pick different NaN codes).
inline constexpr int kAnyNan = 256;

inline constexpr std::array<Saturation, 3> kSaturations = {Saturation::none, Saturation::finite,
                                                           Saturation::all};

inline const char* mode_name(Saturation mode) {
  return mode == Saturation::none ? "none" : mode == Saturation::finite ? "finite" : "all";
}

template <typename T>
const char* fp8_name() {
  return std::is_same_v<T, float8_e4m3fn> ? "float8_e4m3fn" : "float8_e5m2";
}

// The fp8 types, for typed test suites named by Fp8TypeNames.
using Fp8Types = ::testing::Types<float8_e4m3fn, float8_e5m2>;

// Names typed test cases after the fp8 type.
struct Fp8TypeNames {
  template <typename T>
  static std::string GetName(int) {
    return fp8_name<T>();
  }
};

inline int parse_code(const std::string& text) {
  return text == "nan" ? kAnyNan : static_cast<int>(parse_hex(text));
}

// ml_dtypes' result for every fp32 bit pattern, as runs: input bits in
// [first_input[i], first_input[i + 1]) encode to result[i].
struct EncodeRuns {
  std::vector<std::uint32_t> first_input;
  std::vector<int> result;
  int expected(std::uint32_t input_bits) const {
    const auto it = std::upper_bound(first_input.begin(), first_input.end(), input_bits);
    return result[static_cast<std::size_t>(it - first_input.begin()) - 1];
  }
};

inline EncodeRuns load_encode_runs(const std::string& type, Saturation mode) {
  static const auto records = golden_records("fp8_encode_runs.txt");
  EncodeRuns runs;
  for (const auto& r : records) {
    if (r[1] != type || r[2] != mode_name(mode)) continue;
    runs.first_input.push_back(parse_hex(r[3]));
    runs.result.push_back(parse_code(r[4]));
  }
  EXPECT_FALSE(runs.first_input.empty()) << "no runs for " << type << " " << mode_name(mode);
  EXPECT_EQ(runs.first_input.empty() ? 1u : runs.first_input.front(), 0u);
  return runs;
}

}  // namespace gmm::test
