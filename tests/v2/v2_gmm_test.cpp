// v2 gmm (forward and dlhs) against the fp64 oracle on every ISA path this CPU runs.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "gmm/v2/driver.hpp"
#include "support/invalid_calls.hpp"
#include "v2/v2_cases.hpp"

namespace gmm::test::v2 {
namespace {

class V2Gmm : public ::testing::TestWithParam<Isa> {};

// Every shape x recipe once, rotating output dtype, accumulate and transpose_rhs.
TEST_P(V2Gmm, ShapesTimesRecipes) {
  Rng rng(101);
  int variant = 0;
  for (const CaseShape& s : shape_taxonomy()) {
    for (const GmmRecipe& r : gmm_recipes()) {
      Options o = make_options(GetParam(), s);
      o.transpose_rhs = variant & 1;
      o.accumulate = variant & 2;
      const DType out = (variant / 4) % 2 ? DType::bf16 : DType::f32;
      ++variant;
      EXPECT_TRUE(run_gmm_case(rng, s, r, o, out))
          << s.label << " x " << r.label << " transpose=" << o.transpose_rhs
          << " accumulate=" << o.accumulate << " out=" << name(out);
    }
  }
}

// Forward and dlhs of the fp8 training recipe with 1 x 128 (DeepSeek) and whole-row blocks on a
// shape several tiles wide in every direction.
TEST_P(V2Gmm, Fp8RecipeAcrossTiles) {
  Rng rng(202);
  const CaseShape s{"tiles", 300, 256, 136, {100, 0, 77, 123}, 0, 0, {32, 64, 64}};
  for (std::int64_t block : {128, 256}) {
    for (bool transpose : {false, true}) {
      const GmmRecipe r{"fp8",
                        {DType::bf16, {}, dynamic(QType::float8_e4m3fn, block)},
                        {DType::float8_e4m3fn, {1, 0, 1}}};
      Options o = make_options(GetParam(), s);
      o.transpose_rhs = transpose;
      EXPECT_TRUE(run_gmm_case(rng, s, r, o, DType::bf16)) << block << " " << transpose;
    }
  }
}

// A task whose A block over the whole contraction is too large to keep (more than 32 MiB) packs
// it again per block of columns, and allocates no whole block (trace); results are the same.
TEST_P(V2Gmm, LargeAblockRepackedPerColumnBlock) {
  Rng rng(252);
  constexpr std::int64_t kRows = 512, kBlockBytes = 32 * 1024 * 1024;
  const GmmRecipe f32{"f32", {DType::f32}, {DType::f32}};
  const GmmRecipe fp8{"fp8",
                      {DType::bf16, {}, dynamic(QType::float8_e4m3fn, 600)},
                      {DType::float8_e4m3fn, {1, 0, 1}}};
  // Contractions past 32 MiB of packed A at 4 bytes (f32) and 2 bytes (bf16 pairs) per value;
  // 17 columns are two blocks of 16.
  for (const auto& [r, k] :
       {std::pair{f32, std::int64_t{17000}}, std::pair{fp8, std::int64_t{34200}}}) {
    ASSERT_GT(kRows * k * (r.label == "f32" ? 4 : 2), kBlockBytes);
    const CaseShape s{"large_a", kRows, k, 17, {kRows}, 0, 0, {kRows, 512, 16}};
    CallTrace trace;
    Options o = make_options(GetParam(), s);
    o.trace = &trace;
    EXPECT_TRUE(run_gmm_case(rng, s, r, o, DType::f32)) << r.label;
    EXPECT_LT(trace.extra_bytes, kBlockBytes) << r.label;
  }
}

// Without requested tiles, dlhs's transposed weights (contiguous contraction runs) are packed in
// the kits' longer contraction chunks over narrower column blocks: several of each here (a
// contraction of 6300, which AMX's chunks of up to 2048 cut in three, as do the fp8 recipe's
// 2100-long scale blocks; 130 columns, three blocks on the AMX and AVX-512F kits; groups past the
// streaming kernels' rows); the group of 140 rows keeps blocks as wide as its rows, with a chunk
// between the kit's and tiles.k.
TEST_P(V2Gmm, TransposedWeightsInLongChunks) {
  Rng rng(262);
  const CaseShape s{"runs", 180, 6300, 130, {17, 23, 140}};
  const GmmRecipe f32{"f32", {DType::f32}, {DType::f32}};
  const GmmRecipe fp8{"fp8",
                      {DType::bf16, {}, dynamic(QType::float8_e4m3fn, 2100)},
                      {DType::float8_e4m3fn, {1, 0, 1}}};
  for (const GmmRecipe& r : {f32, fp8}) {
    Options o = make_options(GetParam(), s);
    o.transpose_rhs = true;
    EXPECT_TRUE(run_gmm_case(rng, s, r, o, DType::f32)) << r.label;
  }
}

// The trace names the path, family, tiles and what quantized each operand.
TEST_P(V2Gmm, TraceSaysWhatRan) {
  Rng rng(303);
  const CaseShape s{"trace", 20, 64, 48, {12, 8}};
  const GmmRecipe r{
      "fp8", {DType::f32, {}, dynamic(QType::float8_e4m3fn, 32)}, {DType::float8_e5m2, {1, 0, 1}}};
  CallTrace trace;
  Options o = make_options(GetParam(), s);
  o.trace = &trace;
  ASSERT_TRUE(run_gmm_case(rng, s, r, o, DType::f32));
  EXPECT_EQ(trace.op, "gmm");
  EXPECT_EQ(trace.family, Family::v2);
  EXPECT_EQ(trace.isa, GetParam());
  EXPECT_GT(trace.tiles.m, 0);
  EXPECT_EQ(trace.threads, 2);
  EXPECT_EQ(trace.lhs.dtype, DType::float8_e4m3fn);
  EXPECT_TRUE(trace.lhs.quantized);
  EXPECT_EQ(trace.lhs.block, (BlockShape{1, 1, 32}));
  EXPECT_EQ(trace.lhs.quantized_by, "in kernel");
  EXPECT_EQ(trace.rhs.dtype, DType::float8_e5m2);
  EXPECT_EQ(trace.rhs.quantized_by, "caller");
  EXPECT_GT(trace.extra_bytes, 0);

  // fp32 operands never take the bf16 dot product: the fp32 FMA kernel of the path runs.
  const GmmRecipe f32{"f32", {DType::f32}, {DType::f32}};
  ASSERT_TRUE(run_gmm_case(rng, s, f32, o, DType::f32));
  const bool bf16_path = GetParam() == Isa::avx512bf16 || GetParam() == Isa::amx;
  EXPECT_EQ(trace.isa, bf16_path ? Isa::avx512f : GetParam());
  EXPECT_FALSE(trace.lhs.quantized);
  EXPECT_EQ(trace.lhs.quantized_by, "");
}

// Runs case `s` x `r` on `isa` with each of `thread_counts` (the first 1) from the same seed:
// the first run matches the oracle, and every run after it has the first's bits (so it matches
// too).
void expect_oracle_and_same_bits(Isa isa, const CaseShape& s, const GmmRecipe& r, DType out,
                                 std::uint64_t seed, std::initializer_list<int> thread_counts) {
  OwnedOutput first;
  for (int threads : thread_counts) {
    Rng rng(seed);
    if (threads == *thread_counts.begin()) {
      ASSERT_TRUE(run_gmm_case(rng, s, r, make_options(isa, s, threads), out, &first))
          << r.label << " " << threads << " threads";
    } else {
      const GmmCase c = make_gmm_case(rng, s, r, make_options(isa, s, threads), out);
      const OwnedOutput got = c.run(s.group_sizes);
      EXPECT_TRUE(same_bits(first, got)) << r.label << " " << threads << " threads";
    }
  }
}

// The result does not depend on the number of threads, bit for bit.
TEST_P(V2Gmm, SameBitsForAnyThreadCount) {
  const CaseShape s{"threads", 203, 96, 150, {50, 0, 3, 150}, 0, 0, {16, 32, 32}};
  const GmmRecipe r{"fp8",
                    {DType::bf16, {}, dynamic(QType::float8_e4m3fn, 32)},
                    {DType::float8_e4m3fn, {1, 0, 1}}};
  expect_oracle_and_same_bits(GetParam(), s, r, DType::bf16, 404, {1, 2, 3, 5});
}

// One group larger than the others' sum: with several threads its row tasks are cut into column
// ranges (split_tasks); the bits are those of the uncut single-thread run, fp8 and fp32 alike.
TEST_P(V2Gmm, SameBitsForAnyColumnSplit) {
  const CaseShape s{"one big group", 150, 96, 160, {0, 150, 0}, 0, 0, {64, 32, 32}};
  const GmmRecipe fp8{"fp8",
                      {DType::bf16, {}, dynamic(QType::float8_e4m3fn, 32)},
                      {DType::float8_e4m3fn, {1, 0, 1}}};
  const GmmRecipe f32{"f32", {DType::f32}, {DType::f32}};
  for (const GmmRecipe& r : {fp8, f32}) {
    expect_oracle_and_same_bits(GetParam(), s, r, DType::f32, 406, {1, 2, 3});
  }
}

// With the kit's own tiles, a forward task of more rows than a few whose C across all the
// columns is small takes all its columns at once (takes_all_columns: groups of 17 to 90 rows over
// 1000 columns, wider than tiles.n), next to tasks of a few rows. Results match the oracle and
// are the same bits for 1 and 2 threads, fp8 (widened to bf16 pairs) and fp32 alike.
TEST_P(V2Gmm, RowsWithSmallCTakeAllColumns) {
  const CaseShape s{"small C", 156, 512, 1000, {17, 40, 0, 90, 9}};
  const GmmRecipe fp8{"fp8",
                      {DType::bf16, {}, dynamic(QType::float8_e4m3fn, 256)},
                      {DType::float8_e4m3fn, {1, 0, 1}}};
  const GmmRecipe f32{"f32", {DType::f32}, {DType::f32}};
  for (const GmmRecipe& r : {fp8, f32}) {
    expect_oracle_and_same_bits(GetParam(), s, r, DType::f32, 408, {1, 2});
  }
}

// Groups of a few rows over more columns than keep their C within kWideBlockBytes (on the AMX
// kit, these groups of 5 to 16 rows are packed, in blocks of 4096 columns: wide_block_columns;
// chunks of 64 and 36), one alone in its call (cut into column ranges on several workers) and
// three together: results match the oracle and are the same bits for 1, 2 and 3 threads, fp8 and
// bf16 weights.
TEST_P(V2Gmm, FewRowsOverManyColumnsInBlocks) {
  const GmmRecipe fp8{"fp8",
                      {DType::bf16, {}, dynamic(QType::float8_e4m3fn, 0)},
                      {DType::float8_e4m3fn, {1, 0, 1}}};
  const GmmRecipe bf16{"bf16", {DType::bf16}, {DType::bf16}};
  for (const CaseShape& s : {CaseShape{"one group", 16, 100, 4200, {16}},
                             CaseShape{"three groups", 30, 100, 4200, {5, 16, 9}}}) {
    for (const GmmRecipe& r : {fp8, bf16}) {
      expect_oracle_and_same_bits(GetParam(), s, r, DType::bf16, 409, {1, 2, 3});
    }
  }
}

// The tasks split_tasks makes for jobs of `rows` rows each (K 1000, N 4096, tiles of 512 x 512 x
// 512, the AMX kit's few rows (16), nothing streamed) on `threads` workers.
std::vector<gmm::v2::detail::Task> tasks_for(const std::vector<std::int64_t>& rows, int threads) {
  gmm::v2::detail::Product p;
  p.tiles = {512, 512, 512};
  p.kit.few_rows = 16;
  p.n = 4096;
  std::int64_t a = 0;
  for (std::int64_t r : rows) {
    gmm::v2::detail::Job job;
    job.a_begin = a;
    job.a_end = a += r;
    job.k_end = 1000;
    p.jobs.push_back(job);
  }
  return gmm::v2::detail::split_tasks(p, threads);
}

// Every (row, column) of every job in exactly one task.
::testing::AssertionResult covers_once(const std::vector<std::int64_t>& rows,
                                       const std::vector<gmm::v2::detail::Task>& tasks) {
  std::int64_t total_rows = 0;
  for (std::int64_t r : rows) total_rows += r;
  std::vector<int> count(static_cast<std::size_t>(total_rows * 4096), 0);
  for (const auto& t : tasks) {
    for (std::int64_t i = t.a0; i < t.a1; ++i) {
      for (std::int64_t j = t.n0; j < t.n1; ++j) ++count[i * 4096 + j];
    }
  }
  for (std::size_t e = 0; e < count.size(); ++e) {
    if (count[e] != 1) {
      return ::testing::AssertionFailure()
             << "row " << e / 4096 << " column " << e % 4096 << " in " << count[e] << " tasks";
    }
  }
  return ::testing::AssertionSuccess();
}

// Row tasks the workers can share evenly stay whole (cutting them packs their A rows once per
// column range); uneven ones are cut into column ranges; either way each output once.
TEST(V2Tasks, WholeWhenEvenCutWhenNot) {
  struct Case {
    std::vector<std::int64_t> rows;
    int threads;
    bool whole;
  };
  const Case cases[] = {
      {{1024}, 2, true},               // two row blocks of 512 on two workers
      {{252, 260}, 2, true},           // 1.6% over the even share
      {{200, 312}, 2, false},          // 22% over
      {{1536}, 2, false},              // three row blocks on two workers
      {{1536}, 3, true},               // three on three
      {{1536}, 1, true},               // one worker: never cut
      {{100, 0, 100, 100}, 2, false},  // three equal groups (and an empty one) on two workers
      {{8}, 2, false},                 // one group of a few rows (packed) on two workers
  };
  for (const Case& c : cases) {
    const auto tasks = tasks_for(c.rows, c.threads);
    std::string label;
    for (std::int64_t r : c.rows) label += std::to_string(r) + " ";
    label += "rows, " + std::to_string(c.threads) + " threads";
    bool whole = true;
    for (const auto& t : tasks) whole = whole && t.n0 == 0 && t.n1 == 4096;
    EXPECT_EQ(whole, c.whole) << label;
    EXPECT_TRUE(covers_once(c.rows, tasks)) << label;
  }
}

// A NaN in one group's rows stays in those rows (per-row quantization included).
TEST_P(V2Gmm, NanStaysInItsGroup) {
  for (bool quantize : {false, true}) {
    Rng rng(505);
    const std::int64_t m = 30, k = 40, n = 36;
    const std::vector<std::int32_t> sizes{10, 12, 8};
    OwnedMatrix lhs = random_matrix(rng, DType::bf16, m, k);
    lhs.set(0, 4, 17, std::numeric_limits<float>::quiet_NaN());
    const OwnedMatrix rhs = random_grouped(rng, DType::float8_e4m3fn, 3, k, n, {1, 0, 1});
    Options o;
    o.isa = GetParam();
    o.tiles = {16, 16, 32};
    if (quantize) o.quantize_lhs = dynamic(QType::float8_e4m3fn, 20);
    OwnedOutput got;
    ASSERT_TRUE(check_gmm(lhs.view(), rhs.grouped_view(), sizes,
                          make_output(DType::f32, 1, m, n, 0.0f), o, &got));
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t c = 0; c < n; ++c) {
        EXPECT_EQ(std::isnan(got.at(0, r, c)), r == 4) << r << "," << c;
      }
    }
  }
}

// Groups of at most KernelKit::stream_rows(b) rows take the streaming kernels, their columns
// split into tasks: 4 rows (decode) on the AVX2 and AVX-512F paths, up to 32 on the AVX512_BF16
// path for [K, N] fp8 or bf16 weights (the strip kernel, whose per-thread sums the trace counts; a
// group of 33 rows keeps the packed path), on the AMX path 3 for [K, N] fp8 weights and 1 for
// the others here (runs of 129: transposed weights in runs of 2048 or more take 4). Forward and
// dlhs, fp8 / bf16 / fp32 weights, odd K, ragged N; results match the oracle and are the same
// bits for 1 and 2 threads.
TEST_P(V2Gmm, FewRowsStreamTheWeights) {
  const CaseShape s{"decode", 69, 129, 1100, {1, 3, 0, 4, 2, 6, 20, 33}};
  const GmmRecipe fp8{"fp8",
                      {DType::bf16, {}, dynamic(QType::float8_e4m3fn, 0)},
                      {DType::float8_e4m3fn, {1, 0, 1}}};
  const GmmRecipe bf16{"bf16", {DType::bf16}, {DType::bf16}};
  const GmmRecipe f32{"f32", {DType::f32}, {DType::f32}};
  const GmmRecipe blocks{"fp8_blocks",
                         {DType::bf16, {}, dynamic(QType::float8_e4m3fn, 43)},
                         {DType::float8_e5m2, {1, 43, 100}}};
  for (const GmmRecipe& r : {fp8, bf16, f32, blocks}) {
    for (bool transpose : {false, true}) {
      OwnedOutput first;
      for (int threads : {1, 2}) {
        Rng rng(606);
        CallTrace trace;
        Options o = make_options(GetParam(), s, threads);
        o.transpose_rhs = transpose;
        o.trace = &trace;
        OwnedOutput got;
        ASSERT_TRUE(run_gmm_case(rng, s, r, o, DType::f32, &got))
            << r.label << " transpose=" << transpose << " threads=" << threads;
        const bool strips = trace.isa == Isa::avx512bf16 && !transpose &&
                            r.rhs.dtype != DType::f32 && kernels::cpu_features().avx512vbmi;
        kernels::PanelSource b;  // the rhs as the kit's stream_rows sees it
        b.dtype = r.rhs.dtype;
        b.lane_stride = transpose ? s.k : 1;
        b.k_stride = transpose ? 1 : s.n;
        b.depth = s.k;
        const int stream_rows =
            kernels::select_kit(trace.isa, r.rhs.dtype != DType::f32).stream_rows(b);
        EXPECT_EQ(stream_rows, strips                                     ? 32
                               : trace.isa != Isa::amx                    ? 4
                               : !transpose && r.rhs.dtype != DType::bf16 ? 3
                                                                          : 1)
            << r.label << " " << name(trace.isa) << " transpose=" << transpose;
        std::int64_t streamed_groups = 0;
        for (std::int32_t rows : s.group_sizes) {
          streamed_groups += rows > 0 && rows <= stream_rows;
        }
        // columns per task: 512 of a transposed rhs, else 4 KiB of each weight row
        const std::int64_t columns =
            transpose ? 512 : 4096 / static_cast<std::int64_t>(size_of(r.rhs.dtype));
        EXPECT_EQ(trace.streamed_tasks, streamed_groups * ((s.n + columns - 1) / columns))
            << r.label << " " << name(trace.isa) << " transpose=" << transpose;
#if GMM_KERNELS_X86
        if (strips) {  // each worker's strip kernel sums count as extra bytes
          EXPECT_GE(trace.extra_bytes, trace.threads * kernels::strip_scratch_bytes())
              << r.label << " threads=" << threads;
        }
#endif
        if (threads == 1) {
          first = got;
        } else {
          EXPECT_TRUE(same_bits(first, got)) << r.label << " transpose=" << transpose;
        }
      }
    }
  }
}

// Transposed weights stream groups of up to 4 rows on every path, except that the AMX path
// streams only one row of runs shorter than 2048 (packing them for its tile kernel costs less):
// groups of 1, 2, 4 and 5 rows over runs of 2047 and 2048, bf16; results match the oracle.
TEST_P(V2Gmm, TransposedWeightsStreamByRunLength) {
  const GmmRecipe bf16{"bf16", {DType::bf16}, {DType::bf16}};
  for (std::int64_t k : {2047, 2048}) {
    Rng rng(607);
    const CaseShape s{"runs", 12, k, 40, {1, 2, 4, 5}};
    CallTrace trace;
    Options o = make_options(GetParam(), s);
    o.transpose_rhs = true;
    o.trace = &trace;
    ASSERT_TRUE(run_gmm_case(rng, s, bf16, o, DType::f32)) << k;
    const int streamed_rows = trace.isa == Isa::amx && k < 2048 ? 1 : 4;
    std::int64_t streamed_groups = 0;
    for (std::int32_t rows : s.group_sizes) streamed_groups += rows <= streamed_rows;
    EXPECT_EQ(trace.streamed_tasks, streamed_groups) << k;  // 40 columns: one task per group
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, V2Gmm, ::testing::ValuesIn(supported_isas()), isa_param_name);

// Forcing a path the CPU lacks, or an unknown GMM_ISA, is a gmm::Error.
TEST(V2Isa, ForcingAMissingPathThrows) {
  const kernels::CpuFeatures none;
  EXPECT_EQ(kernels::resolve_isa("test", Isa::scalar, none), Isa::scalar);
  for (Isa isa : {Isa::avx2, Isa::avx512f, Isa::avx512bf16}) {
    EXPECT_THROW(kernels::resolve_isa("test", isa, none), Error) << name(isa);
  }
  const kernels::CpuFeatures avx2_only{true, false, false};
  EXPECT_THROW(kernels::resolve_isa("test", Isa::avx512f, avx2_only), Error);
  EXPECT_EQ(kernels::resolve_isa("test", Isa::automatic, avx2_only), Isa::avx2);
}

// Automatic runs vdpbf16ps for bf16-exact data only where it outpaces fp32 FMA, and AMX but for
// the shortest contractions; a forced path always runs; fp32 data always runs an FMA kernel.
TEST(V2Isa, AutomaticPicksTheFasterKernel) {
  kernels::CpuFeatures intel{true, true, true, false};
  kernels::CpuFeatures zen4{true, true, true, true};
  EXPECT_EQ(kernels::call_kit("test", Isa::automatic, true, intel).isa, Isa::avx512f);
  EXPECT_EQ(kernels::call_kit("test", Isa::automatic, true, zen4).isa, Isa::avx512bf16);
  EXPECT_EQ(kernels::call_kit("test", Isa::avx512bf16, true, intel).isa, Isa::avx512bf16);
  EXPECT_EQ(kernels::call_kit("test", Isa::automatic, false, zen4).isa, Isa::avx512f);
  EXPECT_EQ(kernels::call_kit("test", Isa::avx2, true, zen4).isa, Isa::avx2);
  kernels::CpuFeatures sapphire_rapids = intel;
  sapphire_rapids.amx = true;
  EXPECT_EQ(kernels::call_kit("test", Isa::automatic, true, sapphire_rapids).isa, Isa::amx);
  EXPECT_EQ(kernels::call_kit("test", Isa::automatic, false, sapphire_rapids).isa, Isa::avx512f);
  EXPECT_THROW(kernels::call_kit("test", Isa::amx, true, intel), Error);
  // contractions of one or two (tgmm's groups in decode) pass over AMX unless it is forced
  const std::int64_t shortest = kernels::kAmxShortestContraction;
  EXPECT_EQ(kernels::call_kit("test", Isa::automatic, true, sapphire_rapids, shortest - 1).isa,
            Isa::avx512f);
  EXPECT_EQ(kernels::call_kit("test", Isa::automatic, true, sapphire_rapids, shortest).isa,
            Isa::amx);
  EXPECT_EQ(kernels::call_kit("test", Isa::amx, true, sapphire_rapids, 1).isa, Isa::amx);
  kernels::CpuFeatures amx_with_fast_dot = zen4;
  amx_with_fast_dot.amx = true;
  EXPECT_EQ(kernels::call_kit("test", Isa::automatic, true, amx_with_fast_dot, 1).isa,
            Isa::avx512bf16);
}

TEST(V2Isa, EnvironmentForcesAPath) {
  Rng rng(606);
  const CaseShape s{"env", 8, 16, 16, {8}};
  const GmmRecipe r{"bf16", {DType::bf16}, {DType::bf16}};
  CallTrace trace;
  Options o;
  o.trace = &trace;
  ASSERT_EQ(setenv("GMM_ISA", "scalar", 1), 0);
  EXPECT_TRUE(run_gmm_case(rng, s, r, o, DType::f32));
  EXPECT_EQ(trace.isa, Isa::scalar);
  ASSERT_EQ(setenv("GMM_ISA", "avx1024", 1), 0);
  EXPECT_THROW(run_gmm_case(rng, s, r, o, DType::f32), Error);
  o.isa = Isa::scalar;  // the option wins over the environment
  EXPECT_TRUE(run_gmm_case(rng, s, r, o, DType::f32));
  ASSERT_EQ(unsetenv("GMM_ISA"), 0);
  o.isa = Isa::automatic;
  EXPECT_TRUE(run_gmm_case(rng, s, r, o, DType::f32));
  EXPECT_EQ(trace.isa, kernels::call_kit("test", Isa::automatic, true).isa);
}

TEST(V2Isa, ThrowsBeforeWriting) {
  const std::vector<float> x(4, 1.0f);
  std::vector<float> out(4, 5.0f);
  Options o;
  o.isa = Isa::avx512bf16;
  if (kernels::isa_supported(Isa::avx512bf16)) o.isa = Isa::automatic;
  ASSERT_EQ(setenv("GMM_ISA", "bogus", 1), 0);
  const std::vector<std::int32_t> sizes{2};
  EXPECT_THROW(gmm::gmm(view(x.data(), 2, 2), grouped_view(x.data(), 1, 2, 2), sizes,
                        out_view(out.data(), 2, 2), o),
               Error);
  ASSERT_EQ(unsetenv("GMM_ISA"), 0);
  for (float v : out) EXPECT_EQ(v, 5.0f);
}

// v2 rejects every invalid call of the shared list before writing, as v1 and the oracle do.
TEST(V2Errors, GmmRejectsBeforeWriting) {
  for (InvalidCall& c : invalid_gmm_calls()) {
    EXPECT_TRUE(rejects_before_writing(c, [](InvalidCall& call) {
      Options o = call.options;
      o.family = Family::v2;
      gmm::gmm(call.lhs.view(), call.rhs.grouped_view(), call.sizes, call.out_view(), o);
    }));
  }
}

TEST(V2Errors, TgmmRejectsBeforeWriting) {
  for (InvalidCall& c : invalid_tgmm_calls()) {
    EXPECT_TRUE(rejects_before_writing(c, [](InvalidCall& call) {
      Options o = call.options;
      o.family = Family::v2;
      gmm::tgmm(call.lhs.view(), call.rhs.view(), call.sizes, call.out_grouped_view(), o);
    }));
  }
}

// A shard that received no tokens: pre-quantized activations of 0 rows have no scales (their
// scale array is empty), and both families accept them; tgmm's blocks are then zeros.
TEST(EmptyBatch, PreQuantizedActivationsOfNoRowsAreAccepted) {
  const std::vector<float> w(2 * 32 * 16, 0.5f);
  const QArray xq = quantize(view(w.data(), 0, 32), QType::float8_e4m3fn, blocks::per_row);
  const QArray wq =
      quantize(grouped_view(w.data(), 2, 32, 16), QType::float8_e4m3fn, BlockShape{1, 0, 1});
  ASSERT_EQ(xq.matrix().scales.data, nullptr);
  const std::vector<std::int32_t> sizes{0, 0};
  const std::vector<float> no_rows;
  for (Family family : {Family::v1, Family::v2}) {
    Options o;
    o.family = family;
    EXPECT_NO_THROW(gmm::gmm(xq.matrix(), wq.grouped(), sizes, out_view<float>(nullptr, 0, 16), o))
        << name(family);
    std::vector<float> dw(2 * 32 * 16, 7.0f);
    o.quantize_rhs = QuantSpec{QType::float8_e5m2, Calibration::absmax(), 0};
    EXPECT_NO_THROW(gmm::tgmm(xq.matrix(), view(no_rows.data(), 0, 16), sizes,
                              out_grouped_view(dw.data(), 2, 32, 16), o))
        << name(family);
    for (float v : dw) ASSERT_EQ(v, 0.0f) << name(family);
  }
}

}  // namespace
}  // namespace gmm::test::v2
