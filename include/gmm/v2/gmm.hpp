// Kernel family v2: gmm (placeholder until the family lands; every call throws).
#pragma once

#include "gmm/core/problem.hpp"

namespace gmm::v2 {

inline void gmm(const GmmProblem&, const Options&) {
  throw Error("gmm::v2::gmm: not implemented yet");
}

}  // namespace gmm::v2
