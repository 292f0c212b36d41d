// Seeded randomness for tests: a reproducible generator, random values of every dtype, group sizes.
//
// Usage: `gmm::test::Rng rng(1234);` then `rng.uniform(-1, 1)`, `rng.integer(0, 9)`,
// `random_group_sizes(rng, E, rows, 0.3)`. Every random test names its seed so a failure replays.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gmm/core/dtype.hpp"
#include "gmm/core/fp8.hpp"

namespace gmm::test {

// One seeded std::mt19937_64 with the few draws tests need.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : engine_(seed) {}

  double uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(engine_);
  }
  double normal() { return std::normal_distribution<double>(0.0, 1.0)(engine_); }
  // Uniform integer in [lo, hi], both ends included.
  std::int64_t integer(std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(engine_);
  }
  bool chance(double p) { return uniform(0.0, 1.0) < p; }
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
};

// A random element of dtype `d` as the float it stores exactly: f32 and bf16 are N(0, 1) (bf16
// rounded), fp8 values spread over a few binades around 1..64, int8 any of [-127, 127]. Never NaN
// or inf, so random sums stay finite.
inline float random_value(Rng& rng, DType d) {
  switch (d) {
    case DType::f32:
      return static_cast<float>(rng.normal());
    case DType::bf16:
      return static_cast<float>(bfloat16(static_cast<float>(rng.normal())));
    case DType::float8_e4m3fn:
      return static_cast<float>(
          fp8_cast<float8_e4m3fn>(static_cast<float>(rng.normal() * 16.0), Saturation::finite));
    case DType::float8_e5m2:
      return static_cast<float>(
          fp8_cast<float8_e5m2>(static_cast<float>(rng.normal() * 16.0), Saturation::finite));
    case DType::int8:
      return static_cast<float>(rng.integer(-127, 127));
  }
  return 0.0f;
}

// A random positive fp32 scale in [1/8, 8), log-uniform, so a scale applied to the wrong block
// changes results by far more than rounding.
inline float random_scale(Rng& rng) { return std::exp2(static_cast<float>(rng.uniform(-3, 3))); }

// Sizes of `count` groups summing to exactly `total` rows; each group is empty with probability
// `empty_fraction` (at least one group is non-empty when total > 0).
inline std::vector<std::int32_t> random_group_sizes(Rng& rng, std::int64_t count,
                                                    std::int64_t total, double empty_fraction) {
  std::vector<std::int32_t> sizes(static_cast<std::size_t>(count), 0);
  if (count == 0 || total == 0) return sizes;
  std::vector<std::int64_t> open;
  for (std::int64_t g = 0; g < count; ++g) {
    if (!rng.chance(empty_fraction)) open.push_back(g);
  }
  if (open.empty()) open.push_back(rng.integer(0, count - 1));
  for (std::int64_t r = 0; r < total; ++r) {
    ++sizes[open[rng.integer(0, static_cast<std::int64_t>(open.size()) - 1)]];
  }
  return sizes;
}

}  // namespace gmm::test
