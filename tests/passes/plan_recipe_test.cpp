// Plans and recipes: presets, parsing and printing, the auto rule, recipe validation.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "expect_error.hpp"
#include "gmm/plan.hpp"
#include "gmm/recipe.hpp"

namespace gmm {
namespace {

using test::expect_error;

const std::optional<Family> kChoices[] = {Family::v1, Family::v2, std::nullopt};

std::string word(std::optional<Family> f) { return f ? std::string(name(*f)) : "auto"; }

TEST(PlanPresets, AreTheDocumentedTriples) {
  EXPECT_EQ(Plan::v1(), (Plan{Family::v1, Family::v1, Family::v1}));
  EXPECT_EQ(Plan::v2(), (Plan{Family::v2, Family::v2, Family::v2}));
  EXPECT_EQ(Plan::hybrid(), (Plan{Family::v2, Family::v1, Family::v2}));
  EXPECT_EQ(Plan::automatic(), (Plan{std::nullopt, std::nullopt, std::nullopt}));
  EXPECT_EQ(Plan::all_v2(true), Plan::v2());
  EXPECT_EQ(Plan::all_v2(false), Plan::v1());
  EXPECT_EQ(Plan{}, Plan::hybrid());
}

TEST(PlanParse, PresetNamesPrintBack) {
  for (const char* text : {"v1", "v2", "hybrid", "auto"}) {
    EXPECT_EQ(fmt::format("{}", Plan::parse(text)), text);
  }
  EXPECT_EQ(Plan::parse("hybrid"), Plan::hybrid());
  EXPECT_EQ(Plan::parse("auto"), Plan::automatic());
}

TEST(PlanParse, EveryTripleParsesToItsChoicesAndRoundTrips) {
  int non_presets = 0;
  for (auto fwd : kChoices) {
    for (auto dlhs : kChoices) {
      for (auto drhs : kChoices) {
        const std::string text = word(fwd) + "," + word(dlhs) + "," + word(drhs);
        const Plan plan = Plan::parse(text);
        EXPECT_EQ(plan.fwd, fwd) << text;
        EXPECT_EQ(plan.dlhs, dlhs) << text;
        EXPECT_EQ(plan.drhs, drhs) << text;
        const std::string printed = fmt::format("{}", plan);
        EXPECT_EQ(Plan::parse(printed), plan) << text << " printed as " << printed;
        const bool preset = plan == Plan::v1() || plan == Plan::v2() || plan == Plan::hybrid() ||
                            plan == Plan::automatic();
        if (!preset) {
          EXPECT_EQ(printed, text);
          ++non_presets;
        }
      }
    }
  }
  EXPECT_EQ(non_presets, 27 - 4);
}

TEST(PlanParse, TriplesOfPresetsPrintAsThePresetName) {
  EXPECT_EQ(fmt::format("{}", Plan::parse("v2,v1,v2")), "hybrid");
  EXPECT_EQ(fmt::format("{}", Plan::parse("v1,v1,v1")), "v1");
  EXPECT_EQ(fmt::format("{}", Plan::parse("v2,v2,v2")), "v2");
  EXPECT_EQ(fmt::format("{}", Plan::parse("auto,auto,auto")), "auto");
  EXPECT_EQ(fmt::format("{:>8}", Plan::v1()), "      v1");
}

TEST(PlanParse, RejectsAnythingElseNamingTheInput) {
  for (const char* text : {"", "V1", "v3", "hybrid ", " v2", "v1,v2", "v1,v2,v2,v1", "v1,,v2",
                           ",v1,v2", "v2,v1,v2,", "v1;v2;v2", "all", "v2, v1, v2", "1,2,2"}) {
    SCOPED_TRACE(text);
    expect_error([&] { Plan::parse(text); },
                 {"gmm::Plan::parse", "\"v2,v1,v2\"", fmt::format("got \"{}\"", text)});
  }
}

TEST(Arithmetic, AnUnquantizedF32OperandMakesThePassFp32) {
  constexpr DType f32 = DType::f32, bf16 = DType::bf16, e4m3 = DType::float8_e4m3fn;
  EXPECT_EQ(arithmetic_of(f32, false, f32, false), Arithmetic::fp32);
  EXPECT_EQ(arithmetic_of(bf16, false, f32, false), Arithmetic::fp32);
  EXPECT_EQ(arithmetic_of(f32, false, e4m3, false), Arithmetic::fp32);  // weight-only fp8
  EXPECT_EQ(arithmetic_of(bf16, true, f32, false), Arithmetic::fp32);
  EXPECT_EQ(arithmetic_of(f32, true, e4m3, false), Arithmetic::quantized);
  EXPECT_EQ(arithmetic_of(f32, true, f32, true), Arithmetic::quantized);  // drhs, both in call
  EXPECT_EQ(arithmetic_of(bf16, false, DType::int8, false), Arithmetic::quantized);
  EXPECT_EQ(arithmetic_of(e4m3, false, DType::float8_e5m2, false), Arithmetic::quantized);
  EXPECT_EQ(arithmetic_of(bf16, false, bf16, false), Arithmetic::bf16);
}

// Rows per group the rule is probed at: none, decode (1), the benchmark shapes' 16 to 1024,
// and far beyond.
const std::int64_t kRowsPerGroup[] = {0,   1,   2,   8,   16,   32,   64,     100,
                                      127, 128, 129, 256, 1024, 4096, 1 << 20};

PassShape shape_of(std::int64_t groups, std::int64_t rows_per_group, Arithmetic arithmetic) {
  return {groups, groups * rows_per_group, arithmetic};
}

// The default rule with v1 compiled for AVX-512, as in the benchmarks its bounds come from.
Family rule(Pass pass, const PassShape& shape) {
  return auto_family(pass, shape, auto_thresholds, Isa::avx512f);
}

// The documented rule: v2's bf16 kernels beat v1 (fp32 Eigen tiles) on every measured bf16 and
// fp8 cell of every pass but one level cell, so auto never picks v1 for them.
TEST(PlanAuto, Bf16AndQuantizedPassesNeverRunV1) {
  for (Pass pass : all_passes) {
    for (Arithmetic arithmetic : {Arithmetic::bf16, Arithmetic::quantized}) {
      for (std::int64_t groups : {1, 8, 256}) {
        for (std::int64_t rows : kRowsPerGroup) {
          const PassShape shape = shape_of(groups, rows, arithmetic);
          EXPECT_EQ(rule(pass, shape), Family::v2)
              << name(pass) << " " << name(arithmetic) << " " << groups << " x " << rows;
        }
      }
    }
  }
}

// The documented rule in fp32: v2 for every pass and shape (v1 never led by more than the
// noise in the benchmarks of this machine: decode, dsv3, gptoss, qwen3-30b, skewed, mixtral,
// compute-bound).
TEST(PlanAuto, Fp32PassesRunV2OnEveryShape) {
  struct Named {
    const char* name;
    std::int64_t groups, rows_per_group;
  };
  const Named shapes[] = {{"decode", 8, 1},    {"dsv3-up", 256, 16}, {"skewed", 64, 32},
                          {"gptoss", 128, 64}, {"mixtral", 8, 256},  {"compute-bound", 1, 1024}};
  for (Pass pass : all_passes) {
    for (const Named& s : shapes) {
      EXPECT_EQ(rule(pass, shape_of(s.groups, s.rows_per_group, Arithmetic::fp32)), Family::v2)
          << name(pass) << " " << s.name;
    }
  }
}

// For every pass and arithmetic, the choice depends on rows per group only, and once v2 wins
// at some rows per group it wins at every larger one (v1's edge is few rows per weight).
TEST(PlanAuto, TheRuleIsABoundOnRowsPerGroup) {
  for (Pass pass : all_passes) {
    for (Arithmetic arithmetic : all_arithmetics) {
      bool seen_v2 = false;
      for (std::int64_t rows : kRowsPerGroup) {
        SCOPED_TRACE(fmt::format("{} {} {} rows per group", pass, name(arithmetic), rows));
        const Family family = rule(pass, shape_of(8, rows, arithmetic));
        EXPECT_EQ(rule(pass, shape_of(1, rows, arithmetic)), family);
        EXPECT_EQ(rule(pass, shape_of(512, rows, arithmetic)), family);
        EXPECT_FALSE(seen_v2 && family == Family::v1);
        seen_v2 = seen_v2 || family == Family::v2;
      }
      EXPECT_TRUE(seen_v2) << name(pass) << " " << name(arithmetic) << ": v2 on large shapes";
    }
  }
}

TEST(PlanAuto, TheBoundIsInclusiveAndPerPassAndArithmetic) {
  AutoThresholds t;
  t.v1_min_isa = Isa::scalar;
  for (auto& per_pass : t.v1_max_rows_per_group) {
    for (double& bound : per_pass) bound = -1;
  }
  t.v1_max_rows_per_group[static_cast<int>(Pass::dlhs)][static_cast<int>(Arithmetic::bf16)] = 32;
  const PassShape at_bound{8, 8 * 32, Arithmetic::bf16};
  EXPECT_EQ(auto_family(Pass::dlhs, at_bound, t), Family::v1);
  EXPECT_EQ(auto_family(Pass::dlhs, {8, 8 * 32 + 1, Arithmetic::bf16}, t), Family::v2);
  EXPECT_EQ(auto_family(Pass::dlhs, {3, 95, Arithmetic::bf16}, t), Family::v1);  // 31.7
  EXPECT_EQ(auto_family(Pass::dlhs, {3, 97, Arithmetic::bf16}, t), Family::v2);  // 32.3
  for (Pass pass : all_passes) {
    for (Arithmetic arithmetic : all_arithmetics) {
      if (pass == Pass::dlhs && arithmetic == Arithmetic::bf16) continue;
      PassShape s = at_bound;
      s.arithmetic = arithmetic;
      EXPECT_EQ(auto_family(pass, s, t), Family::v2) << name(pass) << " " << name(arithmetic);
      // A negative bound means never v1, even with no rows at all.
      EXPECT_EQ(auto_family(pass, {4, 0, arithmetic}, t), Family::v2);
      EXPECT_EQ(auto_family(pass, {0, 0, arithmetic}, t), Family::v2);
    }
  }
}

// A rule's bounds hold for v1 compiled with AVX-512 (v1_min_isa); built for less (SSE2 Eigen, no
// -march flags), auto never picks v1, even where the bounds would. A plan's auto choice is
// auto_family on the ISA v1 was compiled for.
TEST(PlanAuto, V1RunsOnlyWhenCompiledForTheRulesIsa) {
  AutoThresholds few_rows;  // v1 for fp32 fwd with at most 128 rows per group
  few_rows.v1_max_rows_per_group[static_cast<int>(Pass::fwd)][static_cast<int>(Arithmetic::fp32)] =
      128;
  const PassShape decode = shape_of(8, 1, Arithmetic::fp32);
  EXPECT_EQ(auto_family(Pass::fwd, decode, few_rows, Isa::avx512f), Family::v1);
  for (Pass pass : all_passes) {
    for (Arithmetic arithmetic : all_arithmetics) {
      for (std::int64_t rows : kRowsPerGroup) {
        const PassShape shape = shape_of(8, rows, arithmetic);
        for (Isa isa : {Isa::scalar, Isa::avx2}) {
          EXPECT_EQ(auto_family(pass, shape, few_rows, isa), Family::v2);
        }
        EXPECT_EQ(Plan::automatic().family(pass, shape, few_rows),
                  auto_family(pass, shape, few_rows, v1::compiled_isa()));
      }
    }
  }
  AutoThresholds any_build = few_rows;
  any_build.v1_min_isa = Isa::scalar;
  EXPECT_EQ(auto_family(Pass::fwd, decode, any_build, Isa::scalar), Family::v1);
  EXPECT_EQ(Plan::automatic().family(Pass::fwd, decode, any_build), Family::v1);
}

TEST(PlanAuto, FixedChoicesIgnoreTheShape) {
  const Plan plan = Plan::parse("v2,auto,v1");
  for (Arithmetic arithmetic : all_arithmetics) {
    for (std::int64_t rows : kRowsPerGroup) {
      const PassShape shape = shape_of(4, rows, arithmetic);
      EXPECT_EQ(plan.family(Pass::fwd, shape), Family::v2);
      EXPECT_EQ(plan.family(Pass::dlhs, shape), auto_family(Pass::dlhs, shape));
      EXPECT_EQ(plan.family(Pass::fwd, shape, AutoThresholds{}), Family::v2);
      EXPECT_EQ(plan.family(Pass::drhs, shape), Family::v1);
    }
  }
}

TEST(RecipePresets, NoneQuantizesNothing) {
  const Recipe r = Recipe::none();
  EXPECT_FALSE(r.weight || r.act || r.grad);
  EXPECT_FALSE(r.quantizes());
}

TEST(RecipePresets, Fp8FullIsMaxTextsRule) {
  const Recipe r = Recipe::fp8_full();
  ASSERT_TRUE(r.weight && r.act && r.grad);
  EXPECT_EQ(*r.weight, (QuantRule{QType::float8_e4m3fn, Calibration::absmax()}));
  EXPECT_EQ(*r.act, (QuantRule{QType::float8_e4m3fn, Calibration::absmax()}));
  EXPECT_EQ(*r.grad, (QuantRule{QType::float8_e5m2, Calibration::absmax()}));
  EXPECT_EQ(r.weight_scale, WeightScale::per_channel_shared);
  EXPECT_EQ(r.weight_block(8, 64, 32), (BlockShape{8, 64, 1}));
  EXPECT_EQ(r.act_block_k, 0);
  EXPECT_EQ(r.drhs_block_m, 0);
}

TEST(RecipePresets, Fp8StaticHasAFixedActivationScale) {
  const Recipe r = Recipe::fp8_static(224.0f);
  ASSERT_TRUE(r.act);
  EXPECT_EQ(r.act->calibration.method, Calibration::Method::fixed);
  EXPECT_EQ(r.act->calibration.static_scale(r.act->qtype), 0.5f);  // Qwix: fixed,224 -> 0.5
  Recipe same_but_absmax = r;
  same_but_absmax.act->calibration = Calibration::absmax();
  EXPECT_EQ(same_but_absmax, Recipe::fp8_full());
}

TEST(RecipePresets, Fp8BlockwiseIsDeepSeekV3s) {
  const Recipe r = Recipe::fp8_blockwise();
  ASSERT_TRUE(r.weight && r.act && r.grad);
  EXPECT_EQ(r.weight_block(4, 256, 512), (BlockShape{1, 128, 128}));
  EXPECT_EQ(r.act_block_k, 128);
  EXPECT_EQ(r.drhs_block_m, 128);
  EXPECT_EQ(r.grad->qtype, QType::float8_e4m3fn);
}

TEST(RecipePresets, WeightLayouts) {
  Recipe r = Recipe::fp8_full();
  r.weight_scale = WeightScale::per_tensor;
  EXPECT_EQ(r.weight_block(4, 64, 32), (BlockShape{4, 64, 32}));
  r.weight_scale = WeightScale::per_channel;
  EXPECT_EQ(r.weight_block(4, 64, 32), (BlockShape{1, 64, 1}));
  r.weight_scale = WeightScale::blockwise;
  r.weight_block_k = 16;
  r.weight_block_n = 8;
  EXPECT_EQ(r.weight_block(4, 64, 32), (BlockShape{1, 16, 8}));
}

TEST(RecipeParse, PresetNamesRoundTrip) {
  for (const char* text :
       {"none", "fp8_full", "fp8_blockwise", "fp8_static(224)", "fp8_static(0.5)"}) {
    EXPECT_EQ(fmt::format("{}", Recipe::parse(text)), text);
  }
  EXPECT_EQ(Recipe::parse("fp8_full"), Recipe::fp8_full());
  EXPECT_EQ(Recipe::parse("fp8_static(224)"), Recipe::fp8_static(224.0f));
  EXPECT_EQ(Recipe::parse("fp8_static(-224,224)"), Recipe::fp8_static(224.0f));  // Qwix syntax
}

TEST(RecipeParse, RejectsAnythingElse) {
  for (const char* text : {"", "fp8", "FP8_FULL", "fp8_static", "fp8_static()", "fp8_static(224",
                           "fp8_full ", "int8"}) {
    SCOPED_TRACE(text);
    expect_error([&] { Recipe::parse(text); },
                 {"gmm::Recipe::parse", "fp8_static(MAX)", fmt::format("\"{}\"", text)});
  }
  for (const char* text : {"fp8_static(abc)", "fp8_static(inf)", "fp8_static(-3)",
                           "fp8_static(-200,224)", "fp8_static( 224)", "fp8_static(-224, 224)"}) {
    SCOPED_TRACE(text);
    expect_error([&] { Recipe::parse(text); }, {"gmm::Calibration"});
  }
}

TEST(RecipeDescribe, CustomRecipesPrintEveryField) {
  Recipe r = Recipe::fp8_blockwise();
  r.grad = QuantRule{QType::float8_e5m2, Calibration::absmax()};
  EXPECT_EQ(fmt::format("{}", r),
            "weight float8_e4m3fn absmax blockwise 128x128; act float8_e4m3fn absmax 1x128; grad "
            "float8_e5m2 absmax; drhs blocks 128x1");
  EXPECT_EQ(Recipe::fp8_full().describe(),
            "weight float8_e4m3fn absmax per_channel_shared; act float8_e4m3fn absmax per row; "
            "grad float8_e5m2 absmax; drhs blocks whole M");
  EXPECT_EQ(Recipe::none().describe(),
            "weight unquantized; act unquantized; grad unquantized; drhs blocks whole M");
}

TEST(RecipeValidate, PresetsAreValid) {
  for (const Recipe& r :
       {Recipe::none(), Recipe::fp8_full(), Recipe::fp8_static(224.0f), Recipe::fp8_blockwise()}) {
    EXPECT_NO_THROW(r.validate()) << r.to_string();
  }
}

TEST(RecipeValidate, RefusesCombinationsItCannotHonour) {
  Recipe r = Recipe::fp8_full();
  r.weight->calibration = Calibration::fixed(2.0f);
  expect_error([&] { r.validate(); },
               {"gmm::Recipe", "weight_scale", "per_tensor", "per_channel_shared"});
  r.weight_scale = WeightScale::per_tensor;
  EXPECT_NO_THROW(r.validate());

  r = Recipe::fp8_blockwise();
  r.act->calibration = Calibration::fixed(8.0f);
  expect_error([&] { r.validate(); }, {"act_block_k", "fixed", "got 128"});
  r.act_block_k = 0;
  EXPECT_NO_THROW(r.validate());

  r = Recipe::fp8_full();
  r.grad->calibration = Calibration::fixed(8.0f);
  expect_error([&] { r.validate(); }, {"grad calibration", "absmax", "fixed,8"});

  r = Recipe::fp8_full();
  r.act_block_k = -1;
  expect_error([&] { r.validate(); }, {"act_block_k", "got -1"});
  r = Recipe::fp8_full();
  r.drhs_block_m = -128;
  expect_error([&] { r.validate(); }, {"drhs_block_m", "got -128"});
  r = Recipe::fp8_blockwise();
  r.weight_block_n = 0;
  expect_error([&] { r.validate(); }, {"weight_block_k x weight_block_n", "128 x 0"});

  r = Recipe::fp8_static(1e-30f);  // scale 1e-30 / 448 is below sqrt(FLT_MIN)
  expect_error([&] { r.validate(); }, {"sqrt(FLT_MIN)"});
}

}  // namespace
}  // namespace gmm
