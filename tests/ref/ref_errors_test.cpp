// The oracle rejects every invalid call with a gmm::Error naming the argument, before writing.
#include <gtest/gtest.h>

#include "gmm/ref/reference.hpp"
#include "support/invalid_calls.hpp"

namespace gmm::test {
namespace {

TEST(RefErrors, GmmRejectsBeforeWriting) {
  for (InvalidCall& c : invalid_gmm_calls()) {
    EXPECT_TRUE(rejects_before_writing(c, [](InvalidCall& call) {
      ref::gmm(call.lhs.view(), call.rhs.grouped_view(), call.sizes, call.out_view(), call.options);
    }));
  }
}

TEST(RefErrors, TgmmRejectsBeforeWriting) {
  for (InvalidCall& c : invalid_tgmm_calls()) {
    EXPECT_TRUE(rejects_before_writing(c, [](InvalidCall& call) {
      ref::tgmm(call.lhs.view(), call.rhs.view(), call.sizes, call.out_grouped_view(),
                call.options);
    }));
  }
}

// The valid calls the invalid cases start from are accepted, so each error above comes from the
// one thing each case breaks.
TEST(RefErrors, BaseCallsAreValid) {
  Rng rng(1);
  InvalidCall g = detail::valid_gmm(rng, "valid gmm", "");
  EXPECT_NO_THROW(ref::gmm(g.lhs.view(), g.rhs.grouped_view(), g.sizes, g.out_view()));
  InvalidCall t = detail::valid_tgmm(rng, "valid tgmm", "");
  EXPECT_NO_THROW(ref::tgmm(t.lhs.view(), t.rhs.view(), t.sizes, t.out_grouped_view()));
}

}  // namespace
}  // namespace gmm::test
