// Slow, exhaustive v2 variants: every shape x recipe x output dtype x accumulate (x transpose_rhs)
// x thread count, on every ISA path this CPU runs.
#include <gtest/gtest.h>

#include "v2/v2_cases.hpp"

namespace gmm::test::v2 {
namespace {

class V2Exhaustive : public ::testing::TestWithParam<Isa> {};

TEST_P(V2Exhaustive, Gmm) {
  Rng rng(131);
  for (const CaseShape& s : shape_taxonomy()) {
    for (const GmmRecipe& r : gmm_recipes()) {
      for (int variant = 0; variant < 8; ++variant) {
        Options o = make_options(GetParam(), s, 1 + variant % 3);
        o.transpose_rhs = variant & 1;
        o.accumulate = variant & 2;
        const DType out = variant & 4 ? DType::bf16 : DType::f32;
        EXPECT_TRUE(run_gmm_case(rng, s, r, o, out))
            << s.label << " x " << r.label << " transpose=" << o.transpose_rhs
            << " accumulate=" << o.accumulate << " out=" << name(out);
      }
    }
  }
}

TEST_P(V2Exhaustive, Tgmm) {
  Rng rng(141);
  for (const CaseShape& s : shape_taxonomy()) {
    for (const TgmmRecipe& r : tgmm_recipes()) {
      for (int variant = 0; variant < 4; ++variant) {
        Options o = make_options(GetParam(), s, 1 + variant % 3);
        o.accumulate = variant & 1;
        const DType out = variant & 2 ? DType::bf16 : DType::f32;
        EXPECT_TRUE(run_tgmm_case(rng, s, r, o, out))
            << s.label << " x " << r.label << " accumulate=" << o.accumulate
            << " out=" << name(out);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, V2Exhaustive, ::testing::ValuesIn(supported_isas()), isa_param_name);

}  // namespace
}  // namespace gmm::test::v2
