// Every fp32 bit pattern through fp8_encode in every saturation mode, against ml_dtypes' results
// (tests/data/fp8_encode_runs.txt). Label: slow.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/fp8_runs.hpp"
#include "gmm/core/fp8.hpp"

namespace gmm::test {
namespace {

template <typename T>
class Fp8ExhaustiveTest : public ::testing::Test {};
TYPED_TEST_SUITE(Fp8ExhaustiveTest, Fp8Types, Fp8TypeNames);

TYPED_TEST(Fp8ExhaustiveTest, EveryFp32InputMatchesMlDtypes) {
  using T = TypeParam;
  constexpr std::uint64_t kChunk = 1u << 20;
  std::vector<std::uint32_t> bits(kChunk);
  std::vector<float> x(kChunk);
  std::vector<T> got(kChunk);
  for (Saturation mode : kSaturations) {
    const EncodeRuns runs = load_encode_runs(fp8_name<T>(), mode);
    std::size_t run = 0;
    std::uint64_t mismatches = 0;
    for (std::uint64_t start = 0; start < (1ull << 32); start += kChunk) {
      for (std::uint64_t i = 0; i < kChunk; ++i) bits[i] = static_cast<std::uint32_t>(start + i);
      std::memcpy(x.data(), bits.data(), kChunk * sizeof(float));
      fp8_encode(x.data(), got.data(), kChunk, mode);
      for (std::uint64_t i = 0; i < kChunk; ++i) {
        while (run + 1 < runs.first_input.size() && runs.first_input[run + 1] <= bits[i]) ++run;
        const int want = runs.result[run];
        const bool ok =
            want == kAnyNan ? std::isnan(static_cast<float>(got[i])) : got[i].bits() == want;
        if (!ok && ++mismatches <= 5) {
          ADD_FAILURE() << mode_name(mode) << " input 0x" << std::hex << bits[i] << " gave 0x"
                        << int{got[i].bits()} << ", ml_dtypes 0x" << want;
        }
      }
    }
    EXPECT_EQ(mismatches, 0u) << mode_name(mode);
  }
}

}  // namespace
}  // namespace gmm::test
