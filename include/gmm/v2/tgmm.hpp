// Kernel family v2: tgmm (placeholder until the family lands; every call throws).
#pragma once

#include "gmm/core/problem.hpp"

namespace gmm::v2 {

inline void tgmm(const TgmmProblem&, const Options&) {
  throw Error("gmm::v2::tgmm: not implemented yet");
}

}  // namespace gmm::v2
