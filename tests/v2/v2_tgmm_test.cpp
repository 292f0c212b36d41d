// v2 tgmm (drhs) against the fp64 oracle on every ISA path this CPU runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "v2/v2_cases.hpp"

namespace gmm::test::v2 {
namespace {

class V2Tgmm : public ::testing::TestWithParam<Isa> {};

// Every shape x recipe once, rotating output dtype and accumulate.
TEST_P(V2Tgmm, ShapesTimesRecipes) {
  Rng rng(111);
  int variant = 0;
  for (const CaseShape& s : shape_taxonomy()) {
    for (const TgmmRecipe& r : tgmm_recipes()) {
      Options o = make_options(GetParam(), s);
      o.accumulate = variant & 1;
      const DType out = (variant / 2) % 2 ? DType::bf16 : DType::f32;
      ++variant;
      EXPECT_TRUE(run_tgmm_case(rng, s, r, o, out))
          << s.label << " x " << r.label << " accumulate=" << o.accumulate << " out=" << name(out);
    }
  }
}

// drhs of the fp8 training recipe (both operands quantized in the kernel, blocks along M that
// straddle group boundaries) on a shape several tiles wide.
TEST_P(V2Tgmm, Fp8RecipeAcrossTiles) {
  Rng rng(212);
  const CaseShape s{"tiles", 512, 150, 130, {100, 0, 77, 235}, 0, 0, {32, 64, 48}};
  for (std::int64_t block : {128, 512}) {
    const TgmmRecipe r{"fp8",
                       {DType::bf16, {}, dynamic(QType::float8_e4m3fn, block)},
                       {DType::bf16, {}, dynamic(QType::float8_e5m2, block)}};
    EXPECT_TRUE(run_tgmm_case(rng, s, r, make_options(GetParam(), s), DType::f32)) << block;
  }
}

TEST_P(V2Tgmm, TraceSaysWhatRan) {
  Rng rng(313);
  const CaseShape s{"trace", 20, 64, 48, {12, 8}};
  const TgmmRecipe r{"fp8",
                     {DType::bf16, {}, dynamic(QType::float8_e4m3fn, 10)},
                     {DType::bf16, {}, fixed(QType::float8_e5m2, 8.0f)}};
  CallTrace trace;
  Options o = make_options(GetParam(), s);
  o.trace = &trace;
  ASSERT_TRUE(run_tgmm_case(rng, s, r, o, DType::f32));
  EXPECT_EQ(trace.op, "tgmm");
  EXPECT_EQ(trace.family, Family::v2);
  EXPECT_EQ(trace.isa, GetParam());
  EXPECT_EQ(trace.lhs.dtype, DType::float8_e4m3fn);
  EXPECT_EQ(trace.lhs.block, (BlockShape{1, 10, 1}));
  EXPECT_EQ(trace.lhs.quantized_by, "in kernel");
  EXPECT_EQ(trace.rhs.dtype, DType::float8_e5m2);
  EXPECT_EQ(trace.rhs.block, (BlockShape{1, 20, 48}));
  EXPECT_EQ(trace.rhs.quantized_by, "in kernel");
  EXPECT_GT(trace.extra_bytes, 0);
}

// A long group whose rhs is quantized in the kernel: right against the oracle, and tgmm's tasks
// take no more lanes than keep their packed lhs over the group within kWholeABytes (past it,
// run_task packs and quantizes the lhs again for every block of columns), unless the kit's own
// task rows already take more.
TEST_P(V2Tgmm, LongGroupTasksPackTheirLhsOnce) {
  Rng rng(517);
  const std::int64_t rows = 20000;
  const CaseShape s{"long group", rows, 40, 24, {static_cast<std::int32_t>(rows)}};
  const TgmmRecipe r{"fp8",
                     {DType::bf16, {}, dynamic(QType::float8_e4m3fn, 0)},
                     {DType::bf16, {}, dynamic(QType::float8_e4m3fn, 0)}};
  CallTrace trace;
  Options o = make_options(GetParam(), s);
  o.trace = &trace;
  ASSERT_TRUE(run_tgmm_case(rng, s, r, o, DType::f32));
  const kernels::KernelKit kit = kernels::select_kit(GetParam(), true);
  const std::int64_t kit_rows = gmm::v2::detail::resolve_tiles(kit, Tiles{}).m;
  const std::int64_t packed_lhs_bytes =
      trace.tiles.m * rows * static_cast<std::int64_t>(kit.format.element_bytes());
  EXPECT_TRUE(packed_lhs_bytes <= gmm::v2::detail::kWholeABytes || trace.tiles.m == kit_rows)
      << "tiles.m " << trace.tiles.m << ", packed lhs " << packed_lhs_bytes << " bytes";
}

// The result does not depend on the number of threads, bit for bit: groups of mixed sizes, and
// one group only, whose few lane tasks are cut into column ranges with several threads
// (split_tasks).
TEST_P(V2Tgmm, SameBitsForAnyThreadCount) {
  const TgmmRecipe r{"fp8",
                     {DType::bf16, {}, dynamic(QType::float8_e4m3fn, 40)},
                     {DType::bf16, {}, dynamic(QType::float8_e5m2, 40)}};
  for (const CaseShape& s : {CaseShape{"mixed", 200, 70, 90, {50, 0, 3, 147}, 0, 0, {16, 32, 32}},
                             CaseShape{"one group", 120, 70, 160, {120}, 0, 0, {32, 32, 32}}}) {
    OwnedOutput first;
    for (int threads : {1, 2, 3}) {
      Rng rng(414);
      OwnedOutput got;
      ASSERT_TRUE(run_tgmm_case(rng, s, r, make_options(GetParam(), s, threads), DType::f32, &got))
          << s.label << " " << threads << " threads";
      if (threads == 1) {
        first = got;
      } else {
        EXPECT_TRUE(same_bits(first, got)) << s.label << " " << threads << " threads";
      }
    }
  }
}

// A group longer than one contraction chunk (600 rows, chunks of 128), in narrow column blocks
// (B packed for all its chunks within kWideBlockBytes: each panel of the lhs runs across the
// chunks, C one panel), in wide ones (B over 512 KiB: the chunks outermost, C the task's 416
// rows, 832 KiB) and in wider ones (C of the task's rows over kTaskOfCBytes: passes of the lhs
// panels across the chunks, 128 rows at a time): the narrow blocks right against the oracle, and
// the other two the same bits (so just as right), the chunks' scaled sums added in the same
// order.
TEST_P(V2Tgmm, ChunkOrderKeepsTheBits) {
  const std::vector<TgmmRecipe> recipes = {{"bf16", {DType::bf16}, {DType::bf16}},
                                           {"fp8",
                                            {DType::bf16, {}, dynamic(QType::float8_e4m3fn, 128)},
                                            {DType::bf16, {}, dynamic(QType::float8_e5m2, 128)}}};
  for (const TgmmRecipe& r : recipes) {
    OwnedOutput narrow;
    for (std::int64_t block_cols : {32, 512, 1024}) {
      Rng rng(616);
      const std::int64_t lanes = gmm::v2::detail::kTaskOfCBytes / (1024 * 4) + 32;
      const CaseShape s{"long group", 640, lanes, 1040, {600, 40}, 0, 0, {lanes, 128, block_cols}};
      if (block_cols == 32) {
        ASSERT_TRUE(run_tgmm_case(rng, s, r, make_options(GetParam(), s), DType::f32, &narrow))
            << r.label;
      } else {
        const TgmmCase c = make_tgmm_case(rng, s, r, make_options(GetParam(), s), DType::f32);
        const OwnedOutput got = c.run(s.group_sizes);
        EXPECT_TRUE(same_bits(narrow, got)) << r.label << " blocks of " << block_cols;
      }
    }
  }
}

// True when two outputs of the same shape hold the same bits in every element (padding aside).
::testing::AssertionResult same_elements(const OwnedOutput& a, const OwnedOutput& b) {
  const std::size_t size = size_of(a.dtype);
  for (std::int64_t g = 0; g < a.groups; ++g) {
    for (std::int64_t r = 0; r < a.rows; ++r) {
      for (std::int64_t c = 0; c < a.cols; ++c) {
        if (std::memcmp(a.bytes.data() + a.index(g, r, c) * size,
                        b.bytes.data() + b.index(g, r, c) * size, size) != 0) {
          return ::testing::AssertionFailure() << "element " << g << "," << r << "," << c << ": "
                                               << a.at(g, r, c) << " vs " << b.at(g, r, c);
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// An output of at least 32 MiB (a weight gradient like DeepSeek-V3's) whose rows start on cache
// lines is written past the caches on the AVX-512 paths (non-temporal stores, f32 and bf16), an
// empty group's zero block included, its whole tiles by the kit's output kernel (the groups are
// one contraction chunk); so is one whose rows follow each other off the lines (8 or 1 elements
// past a line: whole lines, each row's end joined with the next row's start); with padded rows it
// is not. Every way: right against the oracle on 1 thread, the same bits (padding included) on 2,
// and the same elements as on lines. K = 2061 leaves a last panel of 5 rows on the AVX512_BF16 path
// (its output kernel, part of the rows) and of 3 on the AVX-512F path (the few-rows kernel), and
// f32's N = 2032 a last tile of part of the kits' widths.
TEST_P(V2Tgmm, LargeOutputsBypassTheCaches) {
  const TgmmRecipe r{"bf16", {DType::bf16}, {DType::bf16}};
  const Isa isa = GetParam();
  const bool avx512 = isa == Isa::avx512f || isa == Isa::avx512bf16 || isa == Isa::amx;
  for (DType out : {DType::f32, DType::bf16}) {
    const std::int64_t groups = out == DType::f32 ? 3 : 4;  // over 32 MiB of outputs
    std::vector<std::int32_t> sizes(groups, 2);
    sizes[0] = 4;
    sizes[1] = 0;
    const CaseShape s{"large output", 2 * groups, 2061, out == DType::f32 ? 2032 : 2048, sizes};
    OwnedOutput on_lines;
    // rows on lines, padded rows, and rows that follow each other 8 and 1 elements off the lines
    const std::int64_t layouts[][2] = {{0, 0}, {1, 0}, {0, 8}, {0, 1}};
    for (const auto& [row_pad, offset] : layouts) {
      const std::string layout = fmt::format("{} row_pad {} offset {}", name(out), row_pad, offset);
      OwnedOutput first;
      for (int threads : {1, 2}) {
        Rng rng(415);
        CallTrace trace;
        Options o = make_options(isa, s, threads);
        o.trace = &trace;
        if (threads == 1) {
          ASSERT_TRUE(run_tgmm_case(rng, s, r, o, out, &first, row_pad, offset)) << layout;
        } else {
          const TgmmCase c = make_tgmm_case(rng, s, r, o, out, row_pad, offset);
          const OwnedOutput got = c.run(s.group_sizes);
          EXPECT_TRUE(same_bits(first, got)) << layout;
        }
        EXPECT_EQ(trace.output_past_caches, avx512 && row_pad == 0)
            << layout << ", " << threads << " threads";
      }
      if (row_pad == 0 && offset == 0) {
        on_lines = first;
      } else {
        EXPECT_TRUE(same_elements(on_lines, first)) << layout;
      }
    }
  }
}

// Many short groups (1 to 33 rows, some empty, a shard after group_offset) whose rows share the
// quantization blocks along M (whole M and 24 rows: the absmax tables shared by the groups'
// jobs), K and N not multiples of 32, bf16 and f32 outputs: right against the oracle, and the
// same bits on 1 and 2 threads.
TEST_P(V2Tgmm, ShortGroupsShareScaleBlocks) {
  std::vector<std::int32_t> sizes;
  for (std::int32_t rows = 1; rows <= 33; rows += 4) {
    sizes.push_back(rows);
    sizes.push_back(rows % 3 == 0 ? 0 : 33 - rows);
  }
  std::int64_t m = 0;
  for (std::int32_t rows : sizes) m += rows;
  const std::int64_t local = static_cast<std::int64_t>(sizes.size()) - 3;
  for (std::int64_t block : {0, 24}) {  // whole M, and 11 blocks of M = 264
    const TgmmRecipe r{"fp8",
                       {DType::bf16, {}, dynamic(QType::float8_e4m3fn, block)},
                       {DType::bf16, {}, dynamic(QType::float8_e5m2, block)}};
    for (const CaseShape& s : {CaseShape{"short", m + 3, 70, 45, sizes},
                               CaseShape{"short_shard", m + 3, 37, 90, sizes, local, 2}}) {
      for (DType out : {DType::bf16, DType::f32}) {
        OwnedOutput one;
        for (int threads : {1, 2}) {
          Rng rng(616);
          OwnedOutput got;
          ASSERT_TRUE(run_tgmm_case(rng, s, r, make_options(GetParam(), s, threads), out, &got))
              << s.label << " block " << block << " " << name(out) << " " << threads;
          if (threads == 1) {
            one = got;
          } else {
            EXPECT_TRUE(same_bits(one, got)) << s.label << " block " << block << " " << name(out);
          }
        }
      }
    }
  }
}

// A NaN in one group's rows only reaches that group's block.
TEST_P(V2Tgmm, NanStaysInItsGroup) {
  Rng rng(515);
  const std::int64_t m = 30, k = 20, n = 18;
  const std::vector<std::int32_t> sizes{10, 12, 8};
  OwnedMatrix lhs = random_matrix(rng, DType::bf16, m, k);
  lhs.set(0, 14, 3, std::numeric_limits<float>::quiet_NaN());
  const OwnedMatrix rhs = random_matrix(rng, DType::bf16, m, n);
  Options o;
  o.isa = GetParam();
  o.tiles = {16, 8, 16};
  OwnedOutput got;
  ASSERT_TRUE(
      check_tgmm(lhs.view(), rhs.view(), sizes, make_output(DType::f32, 3, k, n, 0.0f), o, &got));
  for (std::int64_t g = 0; g < 3; ++g) {
    for (std::int64_t r = 0; r < k; ++r) {
      for (std::int64_t c = 0; c < n; ++c) {
        EXPECT_EQ(std::isnan(got.at(g, r, c)), g == 1 && r == 3) << g << "," << r << "," << c;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, V2Tgmm, ::testing::ValuesIn(supported_isas()), isa_param_name);

// Automatic passes over AMX for a tgmm whose groups have at most two rows (decode; see
// kernels::kAmxShortestContraction), and that changes no bits: the same outputs as forced AMX,
// fp8 (both operands quantized in the kernel) and bf16, f32 and bf16 outputs, an empty group
// included. With a group of three rows, automatic keeps AMX.
TEST(V2TgmmIsa, GroupsOfTwoRowsLeaveAmxWithTheSameBits) {
  if (!kernels::isa_supported(Isa::amx)) GTEST_SKIP() << "this CPU has no AMX";
  const char* forced = std::getenv("GMM_ISA");
  if (forced != nullptr && *forced != '\0')
    GTEST_SKIP() << "GMM_ISA=" << forced << " forces a path";
  const TgmmRecipe fp8{"fp8",
                       {DType::bf16, {}, dynamic(QType::float8_e4m3fn, 0)},
                       {DType::bf16, {}, dynamic(QType::float8_e5m2, 0)}};
  const TgmmRecipe bf16{"bf16", {DType::bf16}, {DType::bf16}};
  const CaseShape s{"decode", 10, 300, 260, {1, 2, 0, 1, 2, 2, 1, 1}};
  const Isa without_amx = kernels::call_kit("test", Isa::automatic, true, kernels::cpu_features(),
                                            kernels::kAmxShortestContraction - 1)
                              .isa;
  EXPECT_NE(without_amx, Isa::amx);
  for (const TgmmRecipe& r : {fp8, bf16}) {
    for (DType out : {DType::f32, DType::bf16}) {
      OwnedOutput amx, automatic;
      Rng amx_rng(717), automatic_rng(717);
      ASSERT_TRUE(run_tgmm_case(amx_rng, s, r, make_options(Isa::amx, s), out, &amx))
          << r.label << " " << name(out);
      CallTrace trace;
      Options o = make_options(Isa::automatic, s);
      o.trace = &trace;
      ASSERT_TRUE(run_tgmm_case(automatic_rng, s, r, o, out, &automatic))
          << r.label << " " << name(out);
      EXPECT_EQ(trace.isa, without_amx) << r.label << " " << name(out);
      EXPECT_TRUE(same_bits(amx, automatic)) << r.label << " " << name(out);
    }
  }
  CallTrace trace;
  Options o = make_options(Isa::automatic, s);
  o.trace = &trace;
  Rng rng(718);
  ASSERT_TRUE(run_tgmm_case(rng, {"three rows", 11, 300, 260, {1, 2, 0, 1, 3, 2, 1, 1}}, fp8, o,
                            DType::f32));
  EXPECT_EQ(trace.isa, kernels::call_kit("test", Isa::automatic, true).isa);
}

}  // namespace
}  // namespace gmm::test::v2
