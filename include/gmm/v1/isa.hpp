// The instruction set v1's Eigen tile products were compiled for: v1 has no runtime dispatch.
#pragma once

#include <Eigen/Core>

#include "gmm/core/options.hpp"

namespace gmm::v1 {

// What v1 runs: Eigen vectorizes for the flags the including code is compiled with (-march=native
// gives AVX-512 on an AVX-512 machine); without AVX flags it uses SSE2 at most, reported as
// scalar.
constexpr Isa compiled_isa() {
#if defined(EIGEN_VECTORIZE_AVX512)
  return Isa::avx512f;
#elif defined(EIGEN_VECTORIZE_AVX2)
  return Isa::avx2;
#else
  return Isa::scalar;
#endif
}

}  // namespace gmm::v1
