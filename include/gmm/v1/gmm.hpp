// Kernel family v1: gmm (placeholder until the family lands; every call throws).
#pragma once

#include "gmm/core/problem.hpp"

namespace gmm::v1 {

inline void gmm(const GmmProblem&, const Options&) {
  throw Error("gmm::v1::gmm: not implemented yet");
}

}  // namespace gmm::v1
