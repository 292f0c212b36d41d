// Slow, exhaustive variant of the v1 taxonomy: several tile shapes (down to 1 x 1 x 1), many
// random group patterns, every recipe, forward / transpose_rhs / tgmm (ctest label `slow`).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/cases.hpp"
#include "support/compare.hpp"

namespace gmm::test {
namespace {

const std::vector<Tiles> kTileShapes{{1, 1, 1}, {2, 3, 5}, {4, 8, 8}, {7, 5, 3}, {8, 16, 16}};
constexpr int kRandomPatterns = 8;

std::vector<GroupPattern> all_patterns(std::int64_t tm, Rng& rng) {
  std::vector<GroupPattern> patterns = group_patterns(tm, rng);
  for (int i = 0; i < kRandomPatterns; ++i) patterns.push_back(random_pattern(rng, tm));
  return patterns;
}

Options v1_options(Options o, Tiles tiles, std::int64_t index) {
  o.family = Family::v1;
  o.tiles = tiles;
  o.threads = 1 + static_cast<int>(index % 4);
  return o;
}

class V1GmmExhaustive : public ::testing::TestWithParam<Recipe> {};

TEST_P(V1GmmExhaustive, ForwardAndTransposeRhs) {
  const Recipe& recipe = GetParam();
  Rng rng(std::hash<std::string>{}(recipe.name) + 7);
  std::int64_t index = 0;
  for (const Tiles& tiles : kTileShapes) {
    for (const GroupPattern& pattern : all_patterns(tiles.m, rng)) {
      for (std::int64_t k : extents_around(tiles.k)) {
        for (std::int64_t n : extents_around(tiles.n)) {
          for (const bool transpose : {false, true}) {
            GmmCase c = make_gmm_case(rng, recipe, pattern, k, n, variant_of(index, transpose));
            const Options options = v1_options(c.options, tiles, index++);
            ASSERT_TRUE(check_gmm(c.lhs.view(), c.rhs.grouped_view(), c.sizes, c.out, options))
                << c.name << " tiles " << tiles.m << "x" << tiles.k << "x" << tiles.n;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, V1GmmExhaustive, ::testing::ValuesIn(gmm_recipes()),
                         [](const auto& info) { return info.param.name; });

class V1TgmmExhaustive : public ::testing::TestWithParam<Recipe> {};

TEST_P(V1TgmmExhaustive, Drhs) {
  const Recipe& recipe = GetParam();
  Rng rng(std::hash<std::string>{}(recipe.name) + 8);
  std::int64_t index = 0;
  for (const Tiles& tiles : kTileShapes) {
    for (const GroupPattern& pattern : all_patterns(tiles.m, rng)) {
      for (std::int64_t k : extents_around(tiles.k)) {
        for (std::int64_t n : extents_around(tiles.n)) {
          TgmmCase c = make_tgmm_case(rng, recipe, pattern, k, n, variant_of(index, false));
          const Options options = v1_options(c.options, tiles, index++);
          ASSERT_TRUE(check_tgmm(c.lhs.view(), c.rhs.view(), c.sizes, c.out, options))
              << c.name << " tiles " << tiles.m << "x" << tiles.k << "x" << tiles.n;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, V1TgmmExhaustive, ::testing::ValuesIn(tgmm_recipes()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace gmm::test
