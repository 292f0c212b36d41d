// Group metadata (Megablox make_group_metadata), validation of group_sizes, and the Eigen
// grouped views' split of a matrix into equal groups.
#include "gmm/core/groups.hpp"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "gmm/core/problem.hpp"
#include "support/random.hpp"

namespace gmm {
namespace {

TEST(GroupMetadata, MegabloxExample) {
  const std::vector<std::int32_t> sizes{3, 5};
  const GroupMetadata meta = make_group_metadata(sizes, 8, 4, 0, 2, false);
  EXPECT_EQ(meta.group_offsets, (std::vector<std::int64_t>{0, 3, 8}));
  EXPECT_EQ(meta.group_ids, (std::vector<std::int32_t>{0, 1, 1}));
  EXPECT_EQ(meta.m_tile_ids, (std::vector<std::int32_t>{0, 0, 1}));
  EXPECT_EQ(meta.num_tiles, 3);
  // The shared tile 0 is visited once per group, each visit owning its group's rows.
  EXPECT_EQ(std::make_pair(meta.visit_begin(0), meta.visit_end(0)), std::make_pair(0l, 3l));
  EXPECT_EQ(std::make_pair(meta.visit_begin(1), meta.visit_end(1)), std::make_pair(3l, 4l));
  EXPECT_EQ(std::make_pair(meta.visit_begin(2), meta.visit_end(2)), std::make_pair(4l, 8l));
}

TEST(GroupMetadata, TileSharedByThreeGroupsIsVisitedThreeTimes) {
  const std::vector<std::int32_t> sizes{1, 2, 3, 2};
  const GroupMetadata meta = make_group_metadata(sizes, 8, 8, 0, 4, false);
  EXPECT_EQ(meta.group_ids, (std::vector<std::int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(meta.m_tile_ids, (std::vector<std::int32_t>{0, 0, 0, 0}));
}

TEST(GroupMetadata, EmptyGroupsAreSkippedInGmmAndVisitedOnceInTgmm) {
  const std::vector<std::int32_t> sizes{0, 4, 0, 2, 0};  // offsets 0, 0, 4, 4, 6, 6; M = 8
  const GroupMetadata gmm_meta = make_group_metadata(sizes, 8, 4, 0, 5, false);
  EXPECT_EQ(gmm_meta.group_ids, (std::vector<std::int32_t>{1, 3}));
  EXPECT_EQ(gmm_meta.m_tile_ids, (std::vector<std::int32_t>{0, 1}));
  const GroupMetadata tgmm_meta = make_group_metadata(sizes, 8, 4, 0, 5, true);
  EXPECT_EQ(tgmm_meta.group_ids, (std::vector<std::int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(tgmm_meta.m_tile_ids, (std::vector<std::int32_t>{0, 0, 1, 1, 1}));
  EXPECT_EQ(tgmm_meta.visit_begin(2), tgmm_meta.visit_end(2));
}

TEST(GroupMetadata, TrailingEmptyGroupAtMUsesTheLastTile) {
  const std::vector<std::int32_t> sizes{8, 0};
  const GroupMetadata meta = make_group_metadata(sizes, 8, 4, 0, 2, true);
  EXPECT_EQ(meta.group_ids, (std::vector<std::int32_t>{0, 0, 1}));
  EXPECT_EQ(meta.m_tile_ids, (std::vector<std::int32_t>{0, 1, 1}));
}

TEST(GroupMetadata, ExpertParallelShardListsOnlyLocalGroups) {
  // Global sizes [3, 5, 2, 6], tm = 4: visits (0,0) (1,0) (1,1) (2,2) (3,2) (3,3) (3,4).
  const std::vector<std::int32_t> sizes{3, 5, 2, 6};
  const GroupMetadata meta = make_group_metadata(sizes, 20, 4, 1, 2, false);
  EXPECT_EQ(meta.num_tiles, 3);
  EXPECT_EQ(meta.group_ids, (std::vector<std::int32_t>{1, 1, 2}));
  EXPECT_EQ(meta.m_tile_ids, (std::vector<std::int32_t>{0, 1, 2}));
  EXPECT_EQ(meta.tiles_m, 5);
}

TEST(GroupMetadata, RejectsBadTileAndShard) {
  const std::vector<std::int32_t> sizes{3, 5};
  EXPECT_THROW(make_group_metadata(sizes, 8, 0, 0, 2, false), Error);
  EXPECT_THROW(make_group_metadata(sizes, 8, 4, 1, 2, false), Error);
  EXPECT_THROW(make_group_metadata(sizes, 7, 4, 0, 2, false), Error);
}

// Brute force: for every global group in order and every row tile it intersects, one visit;
// an empty group visits the tile holding its offset (clamped to the last) when asked to.
std::vector<std::pair<std::int32_t, std::int32_t>> enumerate_visits(
    const std::vector<std::int32_t>& sizes, std::int64_t m, std::int64_t tm,
    std::int64_t start_group, std::int64_t num_groups, bool visit_empty) {
  std::vector<std::pair<std::int32_t, std::int32_t>> visits;
  const std::int64_t tiles = (m + tm - 1) / tm;
  std::int64_t offset = 0;
  for (std::int64_t j = 0; j < static_cast<std::int64_t>(sizes.size()); ++j) {
    const bool local = j >= start_group && j < start_group + num_groups;
    if (local && sizes[j] == 0 && visit_empty) {
      visits.emplace_back(j, std::max<std::int64_t>(0, std::min(offset / tm, tiles - 1)));
    }
    for (std::int64_t t = 0; local && t < tiles; ++t) {
      const bool intersects = sizes[j] > 0 && offset < (t + 1) * tm && offset + sizes[j] > t * tm;
      if (intersects) visits.emplace_back(j, t);
    }
    offset += sizes[j];
  }
  return visits;
}

TEST(GroupMetadata, MatchesBruteForceOnRandomCases) {
  test::Rng rng(2024);
  for (int trial = 0; trial < 3000; ++trial) {
    const std::int64_t experts = rng.integer(1, 9);
    const std::int64_t m = rng.integer(0, 40);
    const std::int64_t tm = rng.integer(1, 12);
    const std::int64_t total = rng.integer(0, m);
    const std::vector<std::int32_t> sizes =
        test::random_group_sizes(rng, experts, total, rng.uniform(0.0, 0.7));
    const std::int64_t start = rng.integer(0, experts - 1);
    const std::int64_t count = rng.integer(1, experts - start);
    const bool visit_empty = rng.chance(0.5);
    const GroupMetadata meta = make_group_metadata(sizes, m, tm, start, count, visit_empty);
    const auto expected = enumerate_visits(sizes, m, tm, start, count, visit_empty);
    std::vector<std::pair<std::int32_t, std::int32_t>> got;
    for (std::int64_t i = 0; i < meta.num_tiles; ++i) {
      got.emplace_back(meta.group_ids[i], meta.m_tile_ids[i]);
    }
    ASSERT_EQ(got, expected) << "trial " << trial << " m=" << m << " tm=" << tm
                             << " start=" << start << " count=" << count;
    // Visits of local groups partition exactly the rows those groups own.
    std::vector<int> owner(static_cast<std::size_t>(m), 0);
    for (std::int64_t i = 0; i < meta.num_tiles; ++i) {
      for (std::int64_t r = meta.visit_begin(i); r < meta.visit_end(i); ++r) ++owner[r];
    }
    for (std::int64_t r = 0; r < m; ++r) {
      const bool local = r >= meta.group_offsets[start] && r < meta.group_offsets[start + count];
      ASSERT_EQ(owner[r], local ? 1 : 0) << "trial " << trial << " row " << r;
    }
  }
}

// ---- Validation of group_sizes (core/problem.hpp) --------------------------------------------

std::string group_error(const std::vector<std::int32_t>& sizes, std::int64_t local_groups,
                        std::int64_t group_offset, std::int64_t m) {
  try {
    detail::local_group_rows("gmm::gmm", sizes, local_groups, group_offset, m);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(GroupSizesValidation, NegativeSize) {
  EXPECT_EQ(group_error({2, -1, 3}, 3, 0, 8), "gmm::gmm: group_sizes[1]: expected >= 0, got -1");
}

TEST(GroupSizesValidation, SumAboveM) {
  EXPECT_EQ(group_error({4, 5}, 2, 0, 8), "gmm::gmm: sum(group_sizes): expected <= M = 8, got 9");
}

TEST(GroupSizesValidation, SumAboveMCountsOtherShardsToo) {
  EXPECT_EQ(group_error({6, 1, 3}, 1, 1, 8),
            "gmm::gmm: sum(group_sizes): expected <= M = 8, got 10");
}

TEST(GroupSizesValidation, OffsetPlusGroupsAboveE) {
  EXPECT_EQ(group_error({1, 1, 1}, 2, 2, 8),
            "gmm::gmm: group_offset + G: expected <= len(group_sizes) = 3, got 4");
}

TEST(GroupSizesValidation, NoLocalGroups) {
  EXPECT_EQ(group_error({1, 1}, 0, 0, 8),
            "gmm::gmm: number of local groups G: expected G >= 1, got 0");
}

TEST(GroupSizesValidation, EmptyGroupSizes) {
  EXPECT_EQ(group_error({}, 1, 0, 8),
            "gmm::gmm: group_sizes: expected a non-empty array of int32, got 0 entries");
}

TEST(GroupSizesValidation, NegativeOffset) {
  EXPECT_EQ(group_error({1, 1}, 1, -1, 8), "gmm::gmm: group_offset: expected >= 0, got -1");
}

TEST(GroupSizesValidation, LocalRowsOfAShard) {
  const GroupRows rows =
      detail::local_group_rows("gmm::gmm", std::vector<std::int32_t>{3, 0, 4, 1}, 2, 1, 10);
  EXPECT_EQ(rows.begin, (std::vector<std::int64_t>{3, 3}));
  EXPECT_EQ(rows.end, (std::vector<std::int64_t>{3, 7}));
}

// grouped_view / out_grouped_view split an Eigen matrix into `groups` equal blocks, and refuse a
// count that would leave rows out.
TEST(EigenGroupedViews, GroupsMustDivideTheRows) {
  using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  RowMajor m = RowMajor::Zero(10, 4);
  const GroupedMatrix halves = grouped_view(m, 2);
  EXPECT_EQ(halves.rows, 5);
  EXPECT_EQ(halves.group_stride, 20);
  EXPECT_EQ(out_grouped_view(m, 5).rows, 2);
  for (const std::int64_t groups : {3, 0, -2}) {
    try {
      (void)grouped_view(m, groups);
      ADD_FAILURE() << groups << " groups accepted";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("gmm::grouped_view: groups: expected a positive divisor of the "
                             "matrix's 10 rows, got " +
                             std::to_string(groups)),
                std::string::npos)
          << message;
    }
    EXPECT_THROW((void)out_grouped_view(m, groups), Error) << groups;
  }
  RowMajor empty(0, 4);
  EXPECT_EQ(grouped_view(empty, 0).groups, 0);
}

}  // namespace
}  // namespace gmm
