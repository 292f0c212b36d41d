// The equivalence suite: plans x recipe presets x group patterns x f32 / bf16. For every plan,
// forward and both gradients equal the fp64 oracle of the same quantized math (fp32 summation
// bound), every plan equals every other to fp32 summation error, and fp8 results stay within a
// derived quantization error bound of the unquantized layer. Two tests per case: plans v1, v2,
// hybrid and auto (label equivalence), and all 8 fixed plans and auto (AllPlans*, label
// equivalence-slow).
// auto runs with its default bounds whatever v1 was compiled for, so that it mixes families.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "gmm/passes.hpp"
#include "layer_oracle.hpp"
#include "support/compare.hpp"
#include "support/operands.hpp"
#include "support/random.hpp"

namespace gmm::test {
namespace {

constexpr std::int64_t kM = 256, kK = 256, kN = 128;
constexpr float kSentinel = 12345.0f;

// Group sizes of one layer call: `sizes` of all experts, of which `groups` from `offset` are
// local.
struct Pattern {
  const char* name;
  std::vector<std::int32_t> sizes;
  std::int64_t groups;
  std::int64_t offset;
};

const Pattern kPatterns[] = {
    {"uniform", {64, 64, 64, 64}, 4, 0},
    {"skewed", {181, 47, 21, 7}, 4, 0},
    {"empty_groups", {100, 0, 120, 0}, 4, 0},  // and 36 tail rows past sum(sizes)
    {"shard", {30, 20, 40, 26, 50, 10, 0, 80}, 4, 4},
    {"one_group", {256}, 1, 0},
};

const char* const kRecipes[] = {"none", "fp8_full", "fp8_static(224)", "fp8_blockwise"};

// The plans the default suite compares: each family alone, the hybrid and auto.
std::vector<Plan> main_plans() {
  return {Plan::v1(), Plan::v2(), Plan::hybrid(), Plan::automatic()};
}

// All 8 fixed plans (each pass on either family) and auto (label equivalence-slow).
std::vector<Plan> all_plans() {
  std::vector<Plan> plans;
  for (Family fwd : {Family::v1, Family::v2}) {
    for (Family dlhs : {Family::v1, Family::v2}) {
      for (Family drhs : {Family::v1, Family::v2}) plans.push_back({fwd, dlhs, drhs});
    }
  }
  plans.push_back(Plan::automatic());
  return plans;
}

// Largest unit roundoff of a quantized value relative to itself (normal range): 2^-(p + 1)
// for p mantissa bits.
double unit_roundoff(const std::optional<QuantRule>& rule) {
  if (!rule) return 0.0;
  return rule->qtype == QType::float8_e4m3fn ? 0x1p-4
         : rule->qtype == QType::float8_e5m2 ? 0x1p-3
                                             : 0.0;
}

// Bound on the relative L2 error of a product of two quantized operands against the
// unquantized product. Each element is rounded with relative error |d| <= u (normal range;
// absmax scales keep random data there, and subnormal values are too small to count), so the
// product's error terms a*b*(d_a + d_b + d_a*d_b) have rms at most sqrt(u_a^2 + u_b^2) + u_a*u_b
// times the rms product; independent random signs make ||error|| / ||exact|| concentrate
// there. A bf16 output adds its own rounding (2^-8 relative).
double l2_bound(const std::optional<QuantRule>& a, const std::optional<QuantRule>& b, DType io) {
  const double ua = unit_roundoff(a), ub = unit_roundoff(b);
  return std::sqrt(ua * ua + ub * ub) + ua * ub + (io == DType::bf16 ? 0x1p-8 : 0.0);
}

// ||got - exact|| / ||exact|| over the elements the call owns.
double relative_l2(const OwnedOutput& got, const ref::Exact& exact, bool rows_written) {
  double error = 0.0, norm = 0.0;
  for (std::int64_t g = 0; g < got.groups; ++g) {
    for (std::int64_t r = 0; r < got.rows; ++r) {
      if (!exact.written[rows_written ? r : g]) continue;
      for (std::int64_t c = 0; c < got.cols; ++c) {
        const double e = exact.value[(g * got.rows + r) * got.cols + c];
        error += (got.at(g, r, c) - e) * (got.at(g, r, c) - e);
        norm += e * e;
      }
    }
  }
  return norm > 0.0 ? std::sqrt(error / norm) : 0.0;
}

// |a - b| within twice the fp32 summation bound of each element: the plans agree with each
// other to summation error, not to quantization error.
::testing::AssertionResult plans_agree(const OwnedOutput& a, const OwnedOutput& b,
                                       const ref::Exact& exact, bool rows_written,
                                       const std::function<std::int64_t(std::int64_t)>& terms) {
  std::int64_t bad = 0;
  std::string first;
  for (std::int64_t g = 0; g < a.groups; ++g) {
    for (std::int64_t r = 0; r < a.rows; ++r) {
      for (std::int64_t c = 0; c < a.cols; ++c) {
        const std::size_t e = static_cast<std::size_t>((g * a.rows + r) * a.cols + c);
        const double bound = 2.0 * error_bound(terms(rows_written ? r : g), exact.magnitude[e], 0.0,
                                               exact.value[e], a.dtype);
        if (!(std::fabs(a.at(g, r, c) - b.at(g, r, c)) <= bound) && bad++ == 0) {
          first = fmt::format("[{},{},{}]: {} vs {} (bound {})", g, r, c, a.at(g, r, c),
                              b.at(g, r, c), bound);
        }
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " elements differ, first " << first;
}

struct Case {
  const Pattern* pattern;
  const char* recipe;
  DType io;
  std::uint64_t seed;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string recipe = info.param.recipe;
  for (char& ch : recipe) {
    if (ch == '(' || ch == ')') ch = '_';
  }
  if (recipe.back() == '_') recipe.pop_back();
  return fmt::format("{}_{}_{}", recipe, info.param.pattern->name, name(info.param.io));
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const char* recipe : kRecipes) {
    for (const Pattern& pattern : kPatterns) {
      for (DType io : {DType::f32, DType::bf16}) {
        cases.push_back({&pattern, recipe, io, 7000 + cases.size()});
      }
    }
  }
  return cases;
}

// Runs the layer of case `c` under each of `plans`: each matches the oracle, and each after the
// first matches the first to summation error.
void expect_plans_equivalent(const Case& c, const std::vector<Plan>& plans) {
  const Pattern& pattern = *c.pattern;
  const Recipe recipe = Recipe::parse(c.recipe);
  Rng rng(c.seed);
  const OwnedMatrix x = random_matrix(rng, c.io, kM, kK, {0, 0, 0}, 3);
  const OwnedMatrix w = random_grouped(rng, c.io, pattern.groups, kK, kN, {0, 0, 0}, 2, 5);
  const OwnedMatrix dy = random_matrix(rng, c.io, kM, kN, {0, 0, 0}, 1);
  const LayerValues values = values_of(x, w, dy, pattern.sizes, pattern.offset);
  const LayerExact exact = layer_oracle(values, recipe);
  const LayerExact unquantized = layer_oracle(values, Recipe::none());
  const auto k_terms = [](std::int64_t) { return kK; };
  const auto n_terms = [](std::int64_t) { return kN; };
  const auto group_terms = [&](std::int64_t g) { return values.group_size(g); };

  std::vector<LayerOutputs> results;
  for (const Plan& plan : plans) {
    SCOPED_TRACE(fmt::format("plan {}", plan));
    const LayerOutputs before = make_layer_outputs(values, c.io, kSentinel);
    LayerOutputs out = before;
    Trace trace;
    PassOptions options;
    options.trace = &trace;
    options.auto_rule = auto_bounds_on_any_build();
    const ExpertLayer layer{x.view(), w.grouped_view(), pattern.sizes, pattern.offset};
    const Saved saved = forward(layer, out.y.view(), plan, recipe, options);
    backward(saved, dy.view(), {out.dx.view(), out.dw.grouped_view()}, plan, options);

    EXPECT_TRUE(matches_oracle(exact, values, before, out));
    expect_trace(trace, plan, recipe, values, c.io, options.auto_rule);

    if (!results.empty()) {
      EXPECT_TRUE(plans_agree(out.y, results[0].y, exact.y, true, k_terms)) << "fwd";
      EXPECT_TRUE(plans_agree(out.dx, results[0].dx, exact.dx, true, n_terms)) << "dlhs";
      EXPECT_TRUE(plans_agree(out.dw, results[0].dw, exact.dw, false, group_terms)) << "drhs";
    }

    if (recipe.quantizes()) {
      const double errors[3] = {relative_l2(out.y, unquantized.y, true),
                                relative_l2(out.dx, unquantized.dx, true),
                                relative_l2(out.dw, unquantized.dw, false)};
      const double bounds[3] = {l2_bound(recipe.act, recipe.weight, c.io),
                                l2_bound(recipe.grad, recipe.weight, c.io),
                                l2_bound(recipe.act, recipe.grad, c.io)};
      for (Pass pass : all_passes) {
        const int i = static_cast<int>(pass);
        EXPECT_LE(errors[i], bounds[i]) << name(pass) << " relative L2 error vs unquantized";
      }
      if (results.empty()) {
        std::printf(
            "relative L2 vs unquantized, %s: fwd %.4f (bound %.3f), dlhs %.4f (%.3f), "
            "drhs %.4f (%.3f)\n",
            case_name({c, 0}).c_str(), errors[0], bounds[0], errors[1], bounds[1], errors[2],
            bounds[2]);
      }
    }
    results.push_back(std::move(out));
  }
}

class LayerEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(LayerEquivalence, EveryPlanMatchesTheOracleAndTheOtherPlans) {
  expect_plans_equivalent(GetParam(), main_plans());
}

TEST_P(LayerEquivalence, AllPlansMatchTheOracleAndEachOther) {
  expect_plans_equivalent(GetParam(), all_plans());
}

INSTANTIATE_TEST_SUITE_P(Equivalence, LayerEquivalence, ::testing::ValuesIn(all_cases()),
                         case_name);

}  // namespace
}  // namespace gmm::test
