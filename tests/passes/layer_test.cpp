// gmm::forward / gmm::backward: plan routing (per the kernels' own traces), recipes that must
// quantize, pre-quantized operands, input errors (nothing written), options.
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "expect_error.hpp"
#include "gmm/passes.hpp"
#include "layer_oracle.hpp"
#include "support/compare.hpp"
#include "support/operands.hpp"
#include "support/random.hpp"

namespace gmm::test {
namespace {

constexpr float kSentinel = -777.0f;

// A small layer: 5 experts of which 3 are local (offset 1), one local expert empty, tail rows.
struct SmallLayer {
  std::int64_t m = 96, k = 64, n = 32, groups = 3;
  std::vector<std::int32_t> sizes = {10, 30, 0, 41, 7};
  std::int64_t offset = 1;
  OwnedMatrix x, w, dy;

  explicit SmallLayer(std::uint64_t seed, DType io = DType::f32) { fill(seed, io); }
  // Every expert local and every row routed: group g owns local_sizes[g] rows.
  SmallLayer(std::uint64_t seed, DType io, std::vector<std::int32_t> local_sizes)
      : m(std::accumulate(local_sizes.begin(), local_sizes.end(), std::int64_t{0})),
        groups(static_cast<std::int64_t>(local_sizes.size())),
        sizes(std::move(local_sizes)),
        offset(0) {
    fill(seed, io);
  }
  void fill(std::uint64_t seed, DType io) {
    Rng rng(seed);
    x = random_matrix(rng, io, m, k, {0, 0, 0}, 2);
    w = random_grouped(rng, io, groups, k, n, {0, 0, 0}, 1, 3);
    dy = random_matrix(rng, io, m, n, {0, 0, 0}, 1);
  }
  ExpertLayer layer() const { return {x.view(), w.grouped_view(), sizes, offset}; }
  LayerValues values() const { return values_of(x, w, dy, sizes, offset); }
};

// Runs forward then backward into `out`.
Trace run_step(const SmallLayer& s, LayerOutputs& out, const Plan& plan, const Recipe& recipe,
               PassOptions options = {}) {
  Trace trace;
  options.trace = &trace;
  const Saved saved = forward(s.layer(), out.y.view(), plan, recipe, options);
  backward(saved, s.dy.view(), {out.dx.view(), out.dw.grouped_view()}, plan, options);
  return trace;
}

std::vector<Plan> every_plan() {
  std::vector<Plan> plans;
  for (Family fwd : {Family::v1, Family::v2}) {
    for (Family dlhs : {Family::v1, Family::v2}) {
      for (Family drhs : {Family::v1, Family::v2}) plans.push_back({fwd, dlhs, drhs});
    }
  }
  plans.push_back(Plan::automatic());
  plans.push_back(Plan::parse("v1,auto,v1"));
  return plans;
}

Recipe only(std::optional<QuantRule> weight, std::optional<QuantRule> act,
            std::optional<QuantRule> grad) {
  Recipe r;
  r.weight = weight;
  r.act = act;
  r.grad = grad;
  return r;
}

const QuantRule kE4m3{QType::float8_e4m3fn, Calibration::absmax()};
const QuantRule kE5m2{QType::float8_e5m2, Calibration::absmax()};

// The routing test of MaxText's dlhs `if`-for-`elif` bug (v2 silently replaced v1): for every
// plan, the kernel that reports having run each pass is the family the plan names.
TEST(PlanRouting, EveryPlanRunsEachPassOnTheFamilyItNames) {
  const SmallLayer s(11);
  for (const Recipe& recipe : {Recipe::none(), Recipe::fp8_full()}) {
    for (const Plan& plan : every_plan()) {
      SCOPED_TRACE(fmt::format("plan {} recipe {}", plan, recipe));
      LayerOutputs out = make_layer_outputs(s.values(), DType::f32, kSentinel);
      const Trace trace = run_step(s, out, plan, recipe);
      expect_trace(trace, plan, recipe, s.values(), DType::f32);
      for (Pass pass : all_passes) {
        if (plan.choice(pass)) {
          EXPECT_EQ(trace.at(pass).call.family, *plan.choice(pass));
        }
      }
    }
  }
}

// The dlhs output itself comes from the named family: identical bits to a direct gmm::gmm call
// with that family and the same (folded) operands.
TEST(PlanRouting, DlhsOutputIsTheNamedFamilysOwn) {
  const SmallLayer s(12);
  for (const Plan& plan : {Plan::v1(), Plan::v2(), Plan::hybrid(), Plan::parse("v1,v2,v1")}) {
    SCOPED_TRACE(plan.to_string());
    LayerOutputs out = make_layer_outputs(s.values(), DType::f32, kSentinel);
    run_step(s, out, plan, Recipe::none());
    OwnedOutput direct = make_output(DType::f32, 1, s.m, s.k, kSentinel, 1);
    Options o;
    o.family = *plan.dlhs;
    o.transpose_rhs = true;
    o.group_offset = s.offset;
    gmm::gmm(s.dy.view(), s.w.grouped_view(), s.sizes, direct.view(), o);
    EXPECT_TRUE(same_bits(out.dx, direct));
  }
}

// The auto plan through the layer: each pass runs, per the kernel's own trace, the family
// auto_family names for the shape and arithmetic the layer presents, and the results match the
// oracle. Where the rule's bounds pick v1 (fp32 arithmetic, few rows per group: the small
// layer has 71 rows in 2 of its 3 local groups) v1 is what ran; bf16 and fp8 passes run v2. The
// bounds apply whatever v1 was compiled for (test builds have no AVX-512 flags).
TEST(PlanRouting, AutoRunsWhatItsRuleNamesForEachPass) {
  PassOptions options;
  options.auto_rule = auto_bounds_on_any_build();
  constexpr Arithmetic f32 = Arithmetic::fp32, bf16 = Arithmetic::bf16, q = Arithmetic::quantized;
  struct Setting {
    const char* what;
    DType io;
    Recipe recipe;
    Arithmetic arithmetic[3];  // fwd, dlhs, drhs
  };
  const Setting settings[] = {
      {"f32, no quantization", DType::f32, Recipe::none(), {f32, f32, f32}},
      {"bf16, no quantization", DType::bf16, Recipe::none(), {bf16, bf16, bf16}},
      {"f32, fp8_full", DType::f32, Recipe::fp8_full(), {q, q, q}},
      {"f32, fp8 weights only", DType::f32, only(kE4m3, {}, {}), {f32, f32, f32}},
      // dlhs multiplies dy with the per-channel weight scales folded into it, in f32.
      {"bf16, fp8 weights only", DType::bf16, only(kE4m3, {}, {}), {q, f32, bf16}},
  };
  for (const Setting& setting : settings) {
    SCOPED_TRACE(setting.what);
    const SmallLayer s(15, setting.io);
    const LayerOutputs before = make_layer_outputs(s.values(), setting.io, kSentinel);
    LayerOutputs out = before;
    const Trace trace = run_step(s, out, Plan::automatic(), setting.recipe, options);
    expect_trace(trace, Plan::automatic(), setting.recipe, s.values(), setting.io,
                 options.auto_rule);
    EXPECT_TRUE(matches_oracle(layer_oracle(s.values(), setting.recipe), s.values(), before, out));
    for (Pass pass : all_passes) {
      SCOPED_TRACE(name(pass));
      const Arithmetic arithmetic = setting.arithmetic[static_cast<int>(pass)];
      const Family ran = trace.at(pass).call.family;
      EXPECT_EQ(ran, auto_family(pass, PassShape{2, 71, arithmetic}, options.auto_rule));
      if (arithmetic != Arithmetic::fp32) {
        EXPECT_EQ(ran, Family::v2);
      } else if (pass != Pass::drhs) {
        EXPECT_EQ(ran, Family::v1);
      }
    }
  }
}

// Groups that own no rows do not dilute rows per group (compute-bound's pattern: one expert
// gets every row): one group of bound + 1 rows runs fp32 fwd on v2, the same rows spread over
// four groups run it on v1.
TEST(PlanRouting, AutoCountsOnlyGroupsThatOwnRows) {
  PassOptions options;
  options.auto_rule = auto_bounds_on_any_build();
  const double bound =
      options.auto_rule
          .v1_max_rows_per_group[static_cast<int>(Pass::fwd)][static_cast<int>(Arithmetic::fp32)];
  ASSERT_GE(bound, 1.0) << "the rule runs fp32 fwd with few rows per group on v1";
  const auto rows = static_cast<std::int32_t>(bound) + 1;
  const std::int32_t quarter = rows / 4;
  const std::vector<std::int32_t> one_group = {0, rows, 0, 0};
  const std::vector<std::int32_t> spread = {rows - 3 * quarter, quarter, quarter, quarter};
  for (const auto& [sizes, expected] : {std::pair{one_group, Family::v2}, {spread, Family::v1}}) {
    SCOPED_TRACE(fmt::format("group sizes {}", fmt::join(sizes, ",")));
    const SmallLayer s(16, DType::f32, sizes);
    const LayerOutputs before = make_layer_outputs(s.values(), DType::f32, kSentinel);
    LayerOutputs out = before;
    const Trace trace = run_step(s, out, Plan::automatic(), Recipe::none(), options);
    EXPECT_EQ(trace.at(Pass::fwd).call.family, expected);
    expect_trace(trace, Plan::automatic(), Recipe::none(), s.values(), DType::f32,
                 options.auto_rule);
    EXPECT_TRUE(matches_oracle(layer_oracle(s.values(), Recipe::none()), s.values(), before, out));
  }
}

// With the default rule, v1 runs an auto pass only when v1 was compiled for AVX-512 (the
// bounds' measurements); otherwise auto runs v2, even where the bounds would pick v1.
TEST(PlanRouting, AutoFollowsTheIsaV1WasCompiledFor) {
  const SmallLayer s(17);
  LayerOutputs out = make_layer_outputs(s.values(), DType::f32, kSentinel);
  const Trace trace = run_step(s, out, Plan::automatic(), Recipe::none());
  const bool v1_avx512 = v1::compiled_isa() == Isa::avx512f;
  for (Pass pass : all_passes) {
    SCOPED_TRACE(name(pass));
    const PassShape shape{2, 71, Arithmetic::fp32};
    EXPECT_EQ(trace.at(pass).call.family,
              v1_avx512 ? auto_family(pass, shape, auto_thresholds, Isa::avx512f) : Family::v2);
  }
}

TEST(RecipeQuantizes, EveryPresetQuantizesEachOperandItNames) {
  const SmallLayer s(13);
  Recipe blockwise = Recipe::fp8_blockwise();
  blockwise.weight_block_k = 32;  // K = 64, N = 32
  blockwise.weight_block_n = 16;
  blockwise.act_block_k = 16;
  blockwise.drhs_block_m = 32;
  Recipe per_expert = Recipe::fp8_full();
  per_expert.weight_scale = WeightScale::per_channel;
  Recipe int8 = Recipe::fp8_full();
  int8.weight->qtype = QType::int8;
  int8.act->qtype = QType::int8;
  Recipe per_tensor = Recipe::fp8_full();
  per_tensor.weight_scale = WeightScale::per_tensor;
  per_tensor.weight->calibration = Calibration::fixed(8.0f);
  const Recipe recipes[] = {Recipe::fp8_full(),
                            Recipe::fp8_static(224.0f),
                            blockwise,
                            per_expert,
                            int8,
                            per_tensor,
                            only(kE4m3, {}, {}),
                            only({}, kE4m3, {}),
                            only({}, {}, kE5m2),
                            only(kE4m3, kE4m3, {})};
  for (const Recipe& recipe : recipes) {
    for (const Plan& plan : {Plan::v1(), Plan::v2()}) {
      SCOPED_TRACE(fmt::format("plan {} recipe {}", plan, recipe.describe()));
      const LayerOutputs before = make_layer_outputs(s.values(), DType::f32, kSentinel);
      LayerOutputs out = before;
      const Trace trace = run_step(s, out, plan, recipe);
      expect_trace(trace, plan, recipe, s.values(), DType::f32);
      EXPECT_TRUE(matches_oracle(layer_oracle(s.values(), recipe), s.values(), before, out));
    }
  }
}

// The blockwise preset scaled down to the small layer (K = 64, N = 32, M = 96).
Recipe small_blockwise() {
  Recipe r = Recipe::fp8_blockwise();
  r.weight_block_k = 32;
  r.weight_block_n = 16;
  r.act_block_k = 16;
  r.drhs_block_m = 32;
  return r;
}

TEST(LayerPreQuantized, WeightsQuantizedOnceGiveTheSameBitsAsForwardQuantizingThem) {
  const SmallLayer s(14);
  for (const Recipe& recipe : {Recipe::fp8_full(), small_blockwise()}) {
    for (const Plan& plan : {Plan::v1(), Plan::v2(), Plan::hybrid()}) {
      SCOPED_TRACE(fmt::format("plan {} recipe {}", plan, recipe.describe()));
      LayerOutputs a = make_layer_outputs(s.values(), DType::f32, kSentinel);
      LayerOutputs b = a;
      Trace trace_a, trace_b;
      PassOptions options;
      options.trace = &trace_a;
      const Saved saved_a = forward(s.layer(), a.y.view(), plan, recipe, options);
      backward(saved_a, s.dy.view(), {a.dx.view(), a.dw.grouped_view()}, plan, options);
      EXPECT_TRUE(saved_a.quantized_weight.has_value());
      EXPECT_GT(trace_a.at(Pass::fwd).layer_bytes, 0);

      const QArray wq = quantize_weight(s.w.grouped_view(), recipe);
      ExpertLayer layer = s.layer();
      layer.w = wq.grouped();
      options.trace = &trace_b;
      const Saved saved_b = forward(layer, b.y.view(), plan, recipe, options);
      backward(saved_b, s.dy.view(), {b.dx.view(), b.dw.grouped_view()}, plan, options);
      EXPECT_FALSE(saved_b.quantized_weight.has_value());
      EXPECT_EQ(trace_b.at(Pass::fwd).layer_bytes, 0);
      EXPECT_TRUE(same_bits(a.y, b.y));
      EXPECT_TRUE(same_bits(a.dx, b.dx));
      EXPECT_TRUE(same_bits(a.dw, b.dw));
    }
  }
}

TEST(LayerPreQuantized, ActivationsQuantizedBeforeTheCallAreUsedAsTheyAre) {
  const SmallLayer s(15);
  const Recipe recipe = Recipe::fp8_full();
  const QArray xq = quantize(s.x.view(), QType::float8_e4m3fn, BlockShape{1, 1, 16});
  ExpertLayer layer = s.layer();
  layer.x = xq.matrix();
  for (const Plan& plan : {Plan::v1(), Plan::v2(), Plan::hybrid()}) {
    SCOPED_TRACE(plan.to_string());
    const LayerOutputs before = make_layer_outputs(s.values(), DType::f32, kSentinel);
    LayerOutputs out = before;
    Trace trace;
    PassOptions options;
    options.trace = &trace;
    const Saved saved = forward(layer, out.y.view(), plan, recipe, options);
    backward(saved, s.dy.view(), {out.dx.view(), out.dw.grouped_view()}, plan, options);

    Options fwd;
    fwd.group_offset = s.offset;
    EXPECT_TRUE(matches_gmm_oracle(
        make_gmm_problem("test", layer.x, saved.weight(), s.sizes, out.y.view(), fwd), before.y,
        out.y));
    Options drhs = fwd;
    drhs.quantize_rhs = QuantSpec{QType::float8_e5m2, Calibration::absmax(), 0};
    EXPECT_TRUE(matches_tgmm_oracle(
        make_tgmm_problem("test", layer.x, s.dy.view(), s.sizes, out.dw.grouped_view(), drhs),
        before.dw, out.dw));
    const LayerExact exact = layer_oracle(s.values(), recipe);  // dx does not depend on x
    EXPECT_TRUE(detail::check_output(
        exact.dx, before.dx, out.dx, false,
        [&](std::int64_t, std::int64_t r) { return static_cast<bool>(exact.dx.written[r]); },
        [&](std::int64_t) { return s.n; }));
    for (Pass pass : {Pass::fwd, Pass::drhs}) {
      const OperandTrace& lhs = trace.at(pass).call.lhs;
      EXPECT_EQ(lhs.quantized_by, "caller");
      EXPECT_EQ(lhs.block, (BlockShape{1, 1, 16}));
      EXPECT_EQ(lhs.dtype, DType::float8_e4m3fn);
    }
  }
}

TEST(LayerErrors, AStaticScaleCannotApplyToAPreQuantizedActivation) {
  const SmallLayer s(16);
  const QArray xq = quantize(s.x.view(), QType::float8_e4m3fn, BlockShape{1, 1, 64});
  ExpertLayer layer = s.layer();
  layer.x = xq.matrix();
  const LayerOutputs before = make_layer_outputs(s.values(), DType::f32, kSentinel);
  LayerOutputs out = before;
  expect_error([&] { forward(layer, out.y.view(), Plan::v2(), Recipe::fp8_static(224.0f)); },
               {"gmm::forward", "x dtype", "static (fixed)", "got float8_e4m3fn"});
  expect_error([&] { forward(layer, out.y.view(), Plan::v2(), Recipe::none()); },
               {"gmm::forward", "x dtype", "no act rule", "got float8_e4m3fn"});
  Recipe e5m2_act = Recipe::fp8_full();
  e5m2_act.act->qtype = QType::float8_e5m2;
  expect_error([&] { forward(layer, out.y.view(), Plan::v2(), e5m2_act); },
               {"x dtype", "float8_e5m2 (the recipe's act qtype)", "got float8_e4m3fn"});
  EXPECT_TRUE(same_bits(out.y, before.y));
}

TEST(LayerErrors, PreQuantizedWeightsMustFollowTheRecipe) {
  const SmallLayer s(17);
  Recipe per_expert = Recipe::fp8_full();
  per_expert.weight_scale = WeightScale::per_channel;
  const QArray wq = quantize_weight(s.w.grouped_view(), per_expert);
  ExpertLayer layer = s.layer();
  layer.w = wq.grouped();
  const LayerOutputs before = make_layer_outputs(s.values(), DType::f32, kSentinel);
  LayerOutputs out = before;
  expect_error([&] { forward(layer, out.y.view(), Plan::v1(), Recipe::fp8_full()); },
               {"w scale block", "3x64x1 (per_channel_shared in the recipe)", "got 1x64x1"});
  expect_error([&] { forward(layer, out.y.view(), Plan::v1(), Recipe::none()); },
               {"w dtype", "no weight rule"});
  Recipe int8 = per_expert;
  int8.weight->qtype = QType::int8;
  expect_error([&] { forward(layer, out.y.view(), Plan::v1(), int8); },
               {"w dtype", "int8 (the recipe's weight qtype)"});
  EXPECT_TRUE(same_bits(out.y, before.y));
}

TEST(LayerErrors, RecipeBlocksMustDivideTheLayer) {
  const SmallLayer s(18);
  const LayerOutputs before = make_layer_outputs(s.values(), DType::f32, kSentinel);
  LayerOutputs out = before;
  Recipe r = small_blockwise();
  r.weight_block_k = 48;
  expect_error([&] { forward(s.layer(), out.y.view(), Plan::v2(), r); },
               {"gmm::quantize_weight", "weight_block_k", "divisor of 64", "got 48"});
  r = small_blockwise();
  r.act_block_k = 24;
  expect_error([&] { forward(s.layer(), out.y.view(), Plan::v2(), r); },
               {"gmm::forward", "act_block_k", "divisor of 64", "got 24"});
  r = Recipe::fp8_full();
  r.grad->calibration = Calibration::fixed(1.0f);
  expect_error([&] { forward(s.layer(), out.y.view(), Plan::v2(), r); }, {"grad calibration"});
  EXPECT_TRUE(same_bits(out.y, before.y));

  r = small_blockwise();
  r.drhs_block_m = 40;
  const Saved saved = forward(s.layer(), out.y.view(), Plan::v2(), r);
  expect_error(
      [&] {
        backward(saved, s.dy.view(), {out.dx.view(), out.dw.grouped_view()}, Plan::v2());
      },
      {"gmm::backward", "drhs_block_m", "divisor of 96", "got 40"});
  EXPECT_TRUE(same_bits(out.dx, before.dx));
  EXPECT_TRUE(same_bits(out.dw, before.dw));
}

TEST(LayerErrors, BackwardValidatesBothPassesBeforeWritingEither) {
  const SmallLayer s(19);
  const LayerOutputs before = make_layer_outputs(s.values(), DType::f32, kSentinel);
  LayerOutputs out = before;
  const Saved saved = forward(s.layer(), out.y.view(), Plan::hybrid(), Recipe::fp8_full());
  OwnedOutput bad_dw = make_output(DType::f32, s.groups, s.k, s.n - 1, kSentinel);
  expect_error(
      [&] {
        backward(saved, s.dy.view(), {out.dx.view(), bad_dw.grouped_view()}, Plan::hybrid());
      },
      {"gmm::backward", "out cols (N)", "got 31"});
  EXPECT_TRUE(same_bits(out.dx, before.dx));
  const QArray dyq = quantize(s.dy.view(), QType::float8_e5m2, BlockShape{1, 1, 32});
  expect_error(
      [&] {
        backward(saved, dyq.matrix(), {out.dx.view(), out.dw.grouped_view()}, Plan::hybrid());
      },
      {"dy dtype", "f32 or bf16", "got float8_e5m2"});
  OwnedMatrix short_dy = make_matrix(DType::f32, 1, s.m - 1, s.n,
                                     [](std::int64_t, std::int64_t, std::int64_t) { return 1.0f; });
  expect_error(
      [&] {
        backward(saved, short_dy.view(), {out.dx.view(), out.dw.grouped_view()}, Plan::hybrid());
      },
      {"dy rows (M)", "got 95"});
  // What one family's call checks only as it runs: v2's instruction set (here an unknown GMM_ISA
  // value) and tiles; the hybrid plan runs its v1 dlhs before its v2 drhs.
  const char* isa_before = std::getenv("GMM_ISA");
  const std::string isa_value = isa_before != nullptr ? isa_before : "";
  ASSERT_EQ(setenv("GMM_ISA", "no-such-isa", 1), 0);
  expect_error(
      [&] {
        backward(saved, s.dy.view(), {out.dx.view(), out.dw.grouped_view()}, Plan::hybrid());
      },
      {"gmm::v2::tgmm", "GMM_ISA", "got no-such-isa"});
  ASSERT_EQ(isa_before != nullptr ? setenv("GMM_ISA", isa_value.c_str(), 1) : unsetenv("GMM_ISA"),
            0);
  PassOptions bad_tiles;
  bad_tiles.tiles[static_cast<int>(Pass::drhs)] = Tiles{-1, 0, 0};
  expect_error(
      [&] {
        backward(saved, s.dy.view(), {out.dx.view(), out.dw.grouped_view()}, Plan::hybrid(),
                 bad_tiles);
      },
      {"gmm::backward", "options.tiles.m", "got -1"});
  EXPECT_TRUE(same_bits(out.dx, before.dx));
  EXPECT_TRUE(same_bits(out.dw, before.dw));
}

TEST(LayerErrors, GroupSizesAreCheckedBeforeAnythingIsWritten) {
  SmallLayer s(20);
  s.sizes = {10, 30, -1, 41, 7};
  const LayerOutputs before = make_layer_outputs(s.values(), DType::f32, kSentinel);
  LayerOutputs out = before;
  expect_error([&] { forward(s.layer(), out.y.view(), Plan::v2(), Recipe::fp8_full()); },
               {"gmm::forward", "group_sizes[2]", "got -1"});
  EXPECT_TRUE(same_bits(out.y, before.y));
}

TEST(LayerOptions, SkippedPassesDoNotRunAndLeaveNoTrace) {
  const SmallLayer s(21);
  const LayerOutputs before = make_layer_outputs(s.values(), DType::f32, kSentinel);
  LayerOutputs out = before;
  const Trace full = run_step(s, out, Plan::hybrid(), Recipe::fp8_full());
  ASSERT_TRUE(full.ran(Pass::dlhs));
  Trace trace = full;
  PassOptions options;
  options.trace = &trace;
  LayerOutputs again = before;
  const Saved saved = forward(s.layer(), again.y.view(), Plan::hybrid(), Recipe::fp8_full());
  backward(saved, s.dy.view(), {OutMatrix{}, again.dw.grouped_view()}, Plan::hybrid(), options);
  EXPECT_FALSE(trace.ran(Pass::dlhs));
  EXPECT_TRUE(trace.ran(Pass::drhs));
  EXPECT_TRUE(same_bits(again.dw, out.dw));
  EXPECT_TRUE(same_bits(again.dx, before.dx));
  backward(saved, s.dy.view(), {again.dx.view(), OutGroupedMatrix{}}, Plan::hybrid(), options);
  EXPECT_TRUE(trace.ran(Pass::dlhs));
  EXPECT_FALSE(trace.ran(Pass::drhs));
  EXPECT_TRUE(same_bits(again.dx, out.dx));
  expect_error([&] { trace.at(Pass::drhs); }, {"gmm::Trace::at", "drhs"});
}

TEST(LayerOptions, AccumulateDwAddsToThePreviousGradient) {
  const SmallLayer s(22);
  Rng rng(2222);
  LayerOutputs before = make_layer_outputs(s.values(), DType::f32, kSentinel);
  before.dw = random_output(rng, DType::f32, s.groups, s.k, s.n, 3);
  for (const Plan& plan : {Plan::v1(), Plan::v2()}) {
    SCOPED_TRACE(plan.to_string());
    LayerOutputs out = before;
    const Saved saved = forward(s.layer(), out.y.view(), plan, Recipe::fp8_full());
    Gradients grads{out.dx.view(), out.dw.grouped_view()};
    grads.accumulate_dw = true;
    backward(saved, s.dy.view(), grads, plan);
    EXPECT_TRUE(matches_oracle(layer_oracle(s.values(), Recipe::fp8_full()), s.values(), before,
                               out, /*accumulate_dw=*/true));
  }
}

TEST(LayerOptions, ResultsDoNotDependOnTheThreadCount) {
  const SmallLayer s(23);
  for (const Recipe& recipe : {Recipe::fp8_full(), small_blockwise()}) {
    LayerOutputs one = make_layer_outputs(s.values(), DType::f32, kSentinel);
    LayerOutputs two = one;
    PassOptions options;
    options.threads = 1;
    run_step(s, one, Plan::hybrid(), recipe, options);
    options.threads = 2;
    run_step(s, two, Plan::hybrid(), recipe, options);
    EXPECT_TRUE(same_bits(one.y, two.y));
    EXPECT_TRUE(same_bits(one.dx, two.dx));
    EXPECT_TRUE(same_bits(one.dw, two.dw));
  }
}

TEST(LayerOptions, ThreadsIsaAndTilesReachEveryPass) {
  const SmallLayer s(24);
  LayerOutputs out = make_layer_outputs(s.values(), DType::f32, kSentinel);
  PassOptions options;
  options.threads = 1;
  options.isa = Isa::scalar;
  const Trace hybrid = run_step(s, out, Plan::hybrid(), Recipe::fp8_full(), options);
  for (Pass pass : all_passes) {
    EXPECT_EQ(hybrid.at(pass).call.threads, 1) << name(pass);
  }
  // A forced ISA reaches the v2 passes; v1 (Eigen) has no ISA choice and runs anyway.
  EXPECT_EQ(hybrid.at(Pass::fwd).call.isa, Isa::scalar);
  EXPECT_EQ(hybrid.at(Pass::drhs).call.isa, Isa::scalar);
  EXPECT_EQ(hybrid.at(Pass::dlhs).call.family, Family::v1);
  // v1 runs the tiles it is given (Megablox's tm, tk, tn), so each pass shows its own.
  options.tiles = {Tiles{32, 32, 16}, Tiles{16, 16, 16}, Tiles{32, 16, 32}};
  const Trace v1 = run_step(s, out, Plan::v1(), Recipe::fp8_full(), options);
  for (Pass pass : all_passes) {
    const Tiles& want = options.tiles[static_cast<int>(pass)];
    const Tiles& got = v1.at(pass).call.tiles;
    EXPECT_TRUE(got.m == want.m && got.k == want.k && got.n == want.n)
        << name(pass) << ": " << got.m << "x" << got.k << "x" << got.n;
  }
}

TEST(LayerTrace, PrintsWhatEachPassRan) {
  const SmallLayer s(25);
  LayerOutputs out = make_layer_outputs(s.values(), DType::f32, kSentinel);
  const Trace trace = run_step(s, out, Plan::hybrid(), Recipe::fp8_full());
  const std::string dlhs = fmt::format("{}", trace.at(Pass::dlhs));
  EXPECT_EQ(dlhs.rfind("dlhs: v1 ", 0), 0u) << dlhs;
  EXPECT_NE(dlhs.find("lhs float8_e5m2 scales 1x1x32 (outside kernel)"), std::string::npos) << dlhs;
  EXPECT_NE(dlhs.find("folded weight per-channel scales into dy"), std::string::npos) << dlhs;
  const std::string fwd = fmt::format("{}", trace.at(Pass::fwd));
  EXPECT_NE(fwd.find("lhs float8_e4m3fn scales 1x1x64 (in kernel) | rhs float8_e4m3fn scales "
                     "3x64x1 (caller)"),
            std::string::npos)
      << fwd;
}

}  // namespace
}  // namespace gmm::test
