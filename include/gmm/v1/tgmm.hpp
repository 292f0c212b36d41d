// Kernel family v1: tgmm (placeholder until the family lands; every call throws).
#pragma once

#include "gmm/core/problem.hpp"

namespace gmm::v1 {

inline void tgmm(const TgmmProblem&, const Options&) {
  throw Error("gmm::v1::tgmm: not implemented yet");
}

}  // namespace gmm::v1
