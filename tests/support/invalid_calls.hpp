// Invalid gmm / tgmm calls that every implementation must reject before writing anything.
//
// Usage:
//   for (InvalidCall& c : invalid_gmm_calls()) {
//     EXPECT_TRUE(rejects_before_writing(c, [&](InvalidCall& c) {
//       Options o = c.options;
//       o.family = Family::v1;
//       gmm::gmm(c.lhs.view(), c.rhs.grouped_view(), c.sizes, c.out_view(), o);
//     })) << c.name;
//   }
// (tgmm: invalid_tgmm_calls(), c.rhs.view() and c.out_grouped_view()). Each case's output is
// filled with a sentinel; rejects_before_writing checks that a gmm::Error naming c.argument is
// thrown and that no output byte changed.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmm/core/error.hpp"
#include "gmm/core/options.hpp"
#include "support/operands.hpp"

namespace gmm::test {

// One invalid call: its operands, options and sentinel-filled output.
struct InvalidCall {
  std::string name;      // what is wrong
  std::string argument;  // text the error message must contain
  OwnedMatrix lhs, rhs;  // rhs is [G, K, N] (gmm) or [M, N] (tgmm)
  std::vector<std::int32_t> sizes;
  Options options;
  OwnedOutput out;
  std::optional<DType> out_dtype;  // overrides the output view's dtype

  OutMatrix out_view() {
    OutMatrix v = out.view();
    if (out_dtype) v.dtype = *out_dtype;
    return v;
  }
  OutGroupedMatrix out_grouped_view() {
    OutGroupedMatrix v = out.grouped_view();
    if (out_dtype) v.dtype = *out_dtype;
    return v;
  }
};

constexpr float kInvalidSentinel = 4242.0f;

namespace detail {

// A valid gmm call (M = 8, K = 6, N = 4, two groups) that each invalid case then breaks.
inline InvalidCall valid_gmm(Rng& rng, std::string name, std::string argument) {
  InvalidCall c;
  c.name = std::move(name);
  c.argument = std::move(argument);
  c.lhs = random_matrix(rng, DType::f32, 8, 6);
  c.rhs = random_grouped(rng, DType::f32, 2, 6, 4);
  c.sizes = {3, 4};
  c.out = make_output(DType::f32, 1, 8, 4, kInvalidSentinel, 1);
  return c;
}

// A valid tgmm call (M = 8, K = 6, N = 4, two groups).
inline InvalidCall valid_tgmm(Rng& rng, std::string name, std::string argument) {
  InvalidCall c;
  c.name = std::move(name);
  c.argument = std::move(argument);
  c.lhs = random_matrix(rng, DType::f32, 8, 6);
  c.rhs = random_matrix(rng, DType::f32, 8, 4);
  c.sizes = {3, 4};
  c.out = make_output(DType::f32, 2, 6, 4, kInvalidSentinel, 1);
  return c;
}

}  // namespace detail

inline std::vector<InvalidCall> invalid_gmm_calls() {
  Rng rng(99);
  std::vector<InvalidCall> calls;
  auto add = [&](std::string name, std::string argument, auto&& breaks) {
    InvalidCall c = detail::valid_gmm(rng, std::move(name), std::move(argument));
    breaks(c);
    calls.push_back(std::move(c));
  };
  add("negative group size", "group_sizes[1]", [](InvalidCall& c) { c.sizes = {3, -1}; });
  add("sum of group sizes above M", "sum(group_sizes)", [](InvalidCall& c) { c.sizes = {5, 4}; });
  add("group_offset + G above E", "group_offset + G", [](InvalidCall& c) {
    c.sizes = {3, 4};
    c.options.group_offset = 1;
  });
  add("negative group_offset", "group_offset", [](InvalidCall& c) { c.options.group_offset = -1; });
  add("no local group (G = 0)", "number of local groups G",
      [&](InvalidCall& c) { c.rhs = random_grouped(rng, DType::f32, 0, 6, 4); });
  add("no group sizes", "group_sizes", [](InvalidCall& c) { c.sizes.clear(); });
  add("rhs K differs from lhs K", "rhs rows (K)",
      [&](InvalidCall& c) { c.rhs = random_grouped(rng, DType::f32, 2, 5, 4); });
  add("transposed rhs K differs", "rhs cols (K, transpose_rhs)",
      [](InvalidCall& c) { c.options.transpose_rhs = true; });
  add("out rows differ from M", "out rows (M)",
      [](InvalidCall& c) { c.out = make_output(DType::f32, 1, 7, 4, kInvalidSentinel); });
  add("out cols differ from N", "out cols (N)",
      [](InvalidCall& c) { c.out = make_output(DType::f32, 1, 8, 5, kInvalidSentinel); });
  add("int8 output", "out dtype", [](InvalidCall& c) { c.out_dtype = DType::int8; });
  add("lhs row_stride below cols", "lhs row_stride", [](InvalidCall& c) { c.lhs.row_stride = 5; });
  add("rhs scale block not dividing K", "rhs scale block along rows", [&](InvalidCall& c) {
    c.rhs = random_grouped(rng, DType::float8_e4m3fn, 2, 6, 4, {1, 4, 1});
  });
  add("NaN weight scale", "rhs scales[1]", [&](InvalidCall& c) {
    c.rhs = random_grouped(rng, DType::int8, 2, 6, 4, {1, 0, 1});
    c.rhs.scales[1] = std::nanf("");
  });
  add("infinite activation scale", "lhs scales[2]", [&](InvalidCall& c) {
    c.lhs = random_matrix(rng, DType::float8_e5m2, 8, 6, {1, 1, 0});
    c.lhs.scales[2] = INFINITY;
  });
  add("quantized lhs without scales", "lhs scales", [&](InvalidCall& c) {
    c.lhs = random_matrix(rng, DType::int8, 8, 6, {1, 1, 0});
    c.lhs.scales.clear();
  });
  add("f32 lhs with scales", "lhs scales", [&](InvalidCall& c) {
    c.lhs.scales = {1.0f};
    c.lhs.block = {1, 8, 6};
  });
  add("weight K block not a multiple of the activation K block", "rhs scale block along K",
      [&](InvalidCall& c) {
        c.lhs = random_matrix(rng, DType::float8_e4m3fn, 8, 6, {1, 1, 2});
        c.rhs = random_grouped(rng, DType::float8_e4m3fn, 2, 6, 4, {1, 3, 4});
      });
  add("quantize_lhs of a quantized lhs", "quantize_lhs", [&](InvalidCall& c) {
    c.lhs = random_matrix(rng, DType::float8_e4m3fn, 8, 6, {1, 1, 0});
    c.options.quantize_lhs = QuantSpec{};
  });
  add("quantize_lhs block not dividing K", "quantize_lhs.block", [](InvalidCall& c) {
    c.options.quantize_lhs = QuantSpec{QType::int8, {}, 4};
  });
  add("quantize_rhs in gmm", "quantize_rhs",
      [](InvalidCall& c) { c.options.quantize_rhs = QuantSpec{}; });
  add("fixed calibration scale below sqrt(FLT_MIN)", "fixed scale", [](InvalidCall& c) {
    c.options.quantize_lhs = QuantSpec{QType::float8_e4m3fn, Calibration::fixed(1e-30f), 0};
  });
  add("negative tile extent", "options.tiles.k", [](InvalidCall& c) {
    c.options.tiles = {0, -7, 16};
  });
  return calls;
}

inline std::vector<InvalidCall> invalid_tgmm_calls() {
  Rng rng(98);
  std::vector<InvalidCall> calls;
  auto add = [&](std::string name, std::string argument, auto&& breaks) {
    InvalidCall c = detail::valid_tgmm(rng, std::move(name), std::move(argument));
    breaks(c);
    calls.push_back(std::move(c));
  };
  add("negative group size", "group_sizes[0]", [](InvalidCall& c) { c.sizes = {-2, 4}; });
  add("sum of group sizes above M", "sum(group_sizes)", [](InvalidCall& c) { c.sizes = {5, 4}; });
  add("group_offset + G above E", "group_offset + G", [](InvalidCall& c) {
    c.sizes = {3, 4, 1};
    c.options.group_offset = 2;
  });
  add("no local group (G = 0)", "number of local groups G",
      [](InvalidCall& c) { c.out = make_output(DType::f32, 0, 6, 4, kInvalidSentinel); });
  add("transpose_rhs in tgmm", "transpose_rhs",
      [](InvalidCall& c) { c.options.transpose_rhs = true; });
  add("rhs rows differ from M", "rhs rows (M)",
      [&](InvalidCall& c) { c.rhs = random_matrix(rng, DType::f32, 7, 4); });
  add("out rows differ from K", "out rows (K)",
      [](InvalidCall& c) { c.out = make_output(DType::f32, 2, 5, 4, kInvalidSentinel); });
  add("out cols differ from N", "out cols (N)",
      [](InvalidCall& c) { c.out = make_output(DType::bf16, 2, 6, 3, kInvalidSentinel); });
  add("fp8 output", "out dtype", [](InvalidCall& c) { c.out_dtype = DType::float8_e4m3fn; });
  add("lhs scale block not dividing M", "lhs scale block along rows", [&](InvalidCall& c) {
    c.lhs = random_matrix(rng, DType::float8_e4m3fn, 8, 6, {1, 3, 1});
  });
  add("NaN output-gradient scale", "rhs scales[0]", [&](InvalidCall& c) {
    c.rhs = random_matrix(rng, DType::float8_e5m2, 8, 4, {1, 0, 1});
    c.rhs.scales[0] = std::nanf("");
  });
  add("quantize_rhs block not dividing M", "quantize_rhs.block", [](InvalidCall& c) {
    c.options.quantize_rhs = QuantSpec{QType::float8_e5m2, {}, 3};
  });
  add("quantize_lhs of a quantized lhs", "quantize_lhs", [&](InvalidCall& c) {
    c.lhs = random_matrix(rng, DType::int8, 8, 6, {1, 0, 1});
    c.options.quantize_lhs = QuantSpec{QType::int8, {}, 0};
  });
  add("fixed calibration scale below sqrt(FLT_MIN)", "fixed scale", [](InvalidCall& c) {
    c.options.quantize_rhs = QuantSpec{QType::int8, Calibration::fixed(1e-30f), 0};
  });
  add("negative tile extent", "options.tiles.m", [](InvalidCall& c) {
    c.options.tiles = {-1, 0, 0};
  });
  return calls;
}

// Runs call(c) and checks that it throws gmm::Error whose message contains c.argument, and
// that c.out is unchanged (bit for bit, padding included).
template <typename Call>
::testing::AssertionResult rejects_before_writing(InvalidCall& c, Call&& call) {
  const OwnedOutput before = c.out;
  try {
    call(c);
  } catch (const Error& e) {
    const std::string message = e.what();
    if (message.find(c.argument) == std::string::npos) {
      return ::testing::AssertionFailure()
             << c.name << ": message \"" << message << "\" does not name " << c.argument;
    }
    if (before.bytes != c.out.bytes) {
      return ::testing::AssertionFailure() << c.name << ": output written before the error";
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << c.name << ": no gmm::Error thrown";
}

}  // namespace gmm::test
