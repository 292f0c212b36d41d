// Front end of gmm::gmm and gmm::tgmm: validate once, then hand the problem to a kernel family.
#pragma once

#include "gmm/core/problem.hpp"
#include "gmm/v1/gmm.hpp"
#include "gmm/v1/tgmm.hpp"
#include "gmm/v2/gmm.hpp"
#include "gmm/v2/tgmm.hpp"

namespace gmm {

// Grouped matmul (forward, and dlhs with transpose_rhs):
//   out[r, :] = lhs[r, :] @ W_g for the rows r of local group g, W_g = rhs[g] ([K, N]) or its
//   transpose (rhs [G, N, K]) when options.transpose_rhs. Rows not owned by a local group are
//   written as zeros (left untouched when options.accumulate).
// Throws gmm::Error before writing anything when the input is invalid.
inline void gmm(const Matrix& lhs, const GroupedMatrix& rhs, GroupSizes group_sizes,
                const OutMatrix& out, const Options& options = {}) {
  const GmmProblem problem = make_gmm_problem("gmm::gmm", lhs, rhs, group_sizes, out, options);
  if (options.family == Family::v1) {
    v1::gmm(problem, options);
  } else {
    v2::gmm(problem, options);
  }
}

// Transposed grouped matmul (drhs): out[g] = lhs[rows_g]^T @ rhs[rows_g], out [G, K, N].
// Empty local groups give zero blocks (left untouched when options.accumulate).
inline void tgmm(const Matrix& lhs, const Matrix& rhs, GroupSizes group_sizes,
                 const OutGroupedMatrix& out, const Options& options = {}) {
  const TgmmProblem problem = make_tgmm_problem("gmm::tgmm", lhs, rhs, group_sizes, out, options);
  if (options.family == Family::v1) {
    v1::tgmm(problem, options);
  } else {
    v2::tgmm(problem, options);
  }
}

}  // namespace gmm
