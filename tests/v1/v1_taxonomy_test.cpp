// v1 gmm (forward and transpose_rhs) and tgmm against the fp64 oracle on the generated taxonomy:
// every recipe x group pattern x K and N below / at / above the tile.
#include <gtest/gtest.h>

#include "support/cases.hpp"
#include "support/compare.hpp"

namespace gmm::test {
namespace {

// Small tiles so that every shape class (below, equal, above, several tiles) stays cheap.
constexpr Tiles kSmallTiles{4, 8, 8};

Options v1_options(Options o, std::int64_t index) {
  o.family = Family::v1;
  o.tiles = kSmallTiles;
  o.threads = 1 + static_cast<int>(index % 3);
  return o;
}

class V1Gmm : public ::testing::TestWithParam<Recipe> {};

void run_gmm_taxonomy(const Recipe& recipe, bool transpose_rhs) {
  Rng rng(std::hash<std::string>{}(recipe.name) + transpose_rhs);
  std::int64_t index = 0;
  for (const GroupPattern& pattern : group_patterns(kSmallTiles.m, rng)) {
    for (std::int64_t k : extents_around(kSmallTiles.k)) {
      for (std::int64_t n : extents_around(kSmallTiles.n)) {
        GmmCase c = make_gmm_case(rng, recipe, pattern, k, n, variant_of(index, transpose_rhs));
        const Options options = v1_options(c.options, index++);
        ASSERT_TRUE(check_gmm(c.lhs.view(), c.rhs.grouped_view(), c.sizes, c.out, options))
            << c.name;
      }
    }
  }
}

TEST_P(V1Gmm, Forward) { run_gmm_taxonomy(GetParam(), false); }
TEST_P(V1Gmm, TransposeRhs) { run_gmm_taxonomy(GetParam(), true); }

INSTANTIATE_TEST_SUITE_P(Recipes, V1Gmm, ::testing::ValuesIn(gmm_recipes()),
                         [](const auto& info) { return info.param.name; });

class V1Tgmm : public ::testing::TestWithParam<Recipe> {};

TEST_P(V1Tgmm, Drhs) {
  const Recipe& recipe = GetParam();
  Rng rng(std::hash<std::string>{}(recipe.name));
  std::int64_t index = 0;
  for (const GroupPattern& pattern : group_patterns(kSmallTiles.m, rng)) {
    for (std::int64_t k : extents_around(kSmallTiles.k)) {
      for (std::int64_t n : extents_around(kSmallTiles.n)) {
        TgmmCase c = make_tgmm_case(rng, recipe, pattern, k, n, variant_of(index, false));
        const Options options = v1_options(c.options, index++);
        ASSERT_TRUE(check_tgmm(c.lhs.view(), c.rhs.view(), c.sizes, c.out, options)) << c.name;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, V1Tgmm, ::testing::ValuesIn(tgmm_recipes()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace gmm::test
