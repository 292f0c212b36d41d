// Megablox's group metadata: which (group, row tile) pairs a tiled grouped matmul visits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gmm/core/error.hpp"
#include "gmm/core/problem.hpp"
#include "gmm/core/view.hpp"

namespace gmm {

// The tile grid of a grouped matmul over M rows in row tiles of `tm` (Megablox's
// make_group_metadata). Visit i handles global group group_ids[i] on row tile m_tile_ids[i];
// a row tile shared by k groups is visited k times, once per group, and each visit owns only
// its group's rows of the tile. Only the visits of local groups are listed (expert-parallel
// shards), in group order, so the arrays have exactly num_tiles entries.
struct GroupMetadata {
  std::vector<std::int64_t> group_offsets;  // [E + 1]: group j owns rows [o[j], o[j + 1])
  std::vector<std::int32_t> group_ids;      // [num_tiles] global group id of each visit
  std::vector<std::int32_t> m_tile_ids;     // [num_tiles] row tile of each visit
  std::int64_t num_tiles = 0;
  std::int64_t tm = 1;
  std::int64_t tiles_m = 0;  // ceil(M / tm)

  // Rows [begin, end) of visit i: its group's rows within its tile (empty for the visit of an
  // empty group).
  std::int64_t visit_begin(std::int64_t i) const {
    return std::max(group_offsets[group_ids[i]], m_tile_ids[i] * tm);
  }
  std::int64_t visit_end(std::int64_t i) const {
    return std::max(visit_begin(i), std::min(group_offsets[group_ids[i] + 1],
                                             (m_tile_ids[i] + std::int64_t{1}) * tm));
  }
};

// Builds the metadata of `sizes` (E global groups, already validated: non-negative, summing
// to at most m) for row tile `tm`, for the local groups [start_group, start_group + num_groups).
// A group of size 0 gets no visit, or exactly one when `visit_empty_groups` (tgmm, so that its
// zero output block is written); that visit's tile is the one holding its offset (the last tile
// when the offset is M).
//
// This follows Megablox's algorithm step by step: tiles per group from the tile-rounded start
// and end, group ids repeated by tiles per group, the extra visit of each tile in which a group
// starts mid-way counted by a histogram, tile ids repeated by visits per tile, and the arrays
// rolled so the shard's first group comes first.
inline GroupMetadata make_group_metadata(GroupSizes sizes, std::int64_t m, std::int64_t tm,
                                         std::int64_t start_group, std::int64_t num_groups,
                                         bool visit_empty_groups) {
  constexpr const char* where = "gmm::make_group_metadata";
  detail::require(tm >= 1, where, "tm", ">= 1", tm);
  detail::require(start_group >= 0 && num_groups >= 0 && start_group + num_groups <= sizes.count,
                  where, "local groups [start_group, start_group + num_groups)",
                  fmt::format("within the {} global groups", sizes.count),
                  fmt::format("[{}, {})", start_group, start_group + num_groups));
  const std::int64_t experts = sizes.count;
  GroupMetadata meta;
  meta.tm = tm;
  meta.tiles_m = (m + tm - 1) / tm;
  meta.group_offsets.assign(static_cast<std::size_t>(experts + 1), 0);
  for (std::int64_t j = 0; j < experts; ++j) {
    meta.group_offsets[j + 1] = meta.group_offsets[j] + sizes[j];
  }
  detail::require(meta.group_offsets[experts] <= m, where, "sum(group_sizes)",
                  fmt::format("<= M = {}", m), meta.group_offsets[experts]);

  // Tiles per group: (round_up(end) - round_down(start)) / tm; 0 or 1 for empty groups.
  std::vector<std::int64_t> group_tiles(static_cast<std::size_t>(experts));
  for (std::int64_t j = 0; j < experts; ++j) {
    const std::int64_t start = meta.group_offsets[j], end = meta.group_offsets[j + 1];
    const std::int64_t rounded = (end + tm - 1) / tm * tm - start / tm * tm;
    group_tiles[j] = sizes[j] == 0 ? (visit_empty_groups ? 1 : 0) : rounded / tm;
  }

  // Visits per row tile: one, plus one for each group starting mid-way through it (and, when
  // visiting empty groups, one for each empty group whose offset falls in it).
  std::vector<std::int64_t> tile_visits(static_cast<std::size_t>(meta.tiles_m), 1);
  for (std::int64_t j = 0; j < experts; ++j) {
    const std::int64_t start = meta.group_offsets[j];
    const bool extra = sizes[j] == 0 ? visit_empty_groups : start % tm != 0;
    if (extra && start / tm < meta.tiles_m) ++tile_visits[start / tm];
  }

  // Repeat group ids and tile ids, then keep the local groups' visits (the roll of Megablox
  // followed by its num_tiles bound).
  std::vector<std::int32_t> all_group_ids, all_tile_ids;
  for (std::int64_t j = 0; j < experts; ++j) {
    all_group_ids.insert(all_group_ids.end(), static_cast<std::size_t>(group_tiles[j]),
                         static_cast<std::int32_t>(j));
  }
  for (std::int64_t t = 0; t < meta.tiles_m; ++t) {
    all_tile_ids.insert(all_tile_ids.end(), static_cast<std::size_t>(tile_visits[t]),
                        static_cast<std::int32_t>(t));
  }
  // A trailing empty group at offset M adds a visit but no tile entry: like jnp.repeat with a
  // total length, the last tile id is repeated.
  all_tile_ids.resize(all_group_ids.size(), all_tile_ids.empty() ? 0 : all_tile_ids.back());
  std::int64_t first = 0;
  for (std::int64_t j = 0; j < start_group; ++j) first += group_tiles[j];
  for (std::int64_t j = start_group; j < start_group + num_groups; ++j) {
    meta.num_tiles += group_tiles[j];
  }
  meta.group_ids.assign(all_group_ids.begin() + first,
                        all_group_ids.begin() + first + meta.num_tiles);
  meta.m_tile_ids.assign(all_tile_ids.begin() + first,
                         all_tile_ids.begin() + first + meta.num_tiles);
  return meta;
}

// The metadata of a validated problem's local groups (`rows`, contiguous, of M rows): the rows
// before them (experts of earlier shards) form one leading non-local group, which gives the
// same visits as the global group sizes would. group_ids[i] - 1 is the local group of visit i.
inline GroupMetadata make_group_metadata(const GroupRows& rows, std::int64_t m, std::int64_t tm,
                                         bool visit_empty_groups) {
  const std::int64_t local = rows.count();
  std::vector<std::int32_t> sizes(static_cast<std::size_t>(local + 1));
  sizes[0] = static_cast<std::int32_t>(local > 0 ? rows.begin[0] : 0);
  for (std::int64_t g = 0; g < local; ++g) sizes[g + 1] = static_cast<std::int32_t>(rows.size(g));
  return make_group_metadata(sizes, m, tm, 1, local, visit_empty_groups);
}

}  // namespace gmm
