// The oracle: plain loops with fp64 sums implementing gmm and tgmm exactly as specified.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "gmm/core/problem.hpp"
#include "gmm/core/qvalue.hpp"

namespace gmm::ref {

// The exact (fp64) result of a call before it is rounded into the output: per output element
// the value and sum |a * b| of its terms (the scale of its fp32 summation error bound).
// `written[i]` is false for output rows (gmm) or groups (tgmm) that the call does not own.
struct Exact {
  std::vector<double> value;
  std::vector<double> magnitude;
  std::vector<bool> written;
};

namespace detail {

// Scale of element (g, r, c) of a [groups, rows, cols] operand with the given scales.
inline double scale_at(const Scales& s, std::int64_t rows, std::int64_t cols, std::int64_t g,
                       std::int64_t r, std::int64_t c) {
  const std::int64_t block_rows = rows / s.block.rows, block_cols = cols / s.block.cols;
  return s
      .data[((g / s.block.groups) * block_rows + r / s.block.rows) * block_cols + c / s.block.cols];
}

// Dequantized value of element (r, c) of a 2-D operand as a dense fp64 matrix.
inline std::vector<double> dense(const Matrix& x) {
  std::vector<double> d(static_cast<std::size_t>(x.rows * x.cols));
  for (std::int64_t r = 0; r < x.rows; ++r) {
    for (std::int64_t c = 0; c < x.cols; ++c) {
      double v = load_as_float(x.data, x.dtype, r * x.row_stride + c);
      if (is_quantized(x.dtype)) v *= scale_at(x.scales, x.rows, x.cols, 0, r, c);
      d[r * x.cols + c] = v;
    }
  }
  return d;
}

// Applies Qwix quantize-dequantize to a dense operand: scale blocks of `block_rows` x
// `block_cols` (absmax) or one static scale (fixed).
inline void quantize_dequantize(std::vector<double>& d, std::int64_t rows, std::int64_t cols,
                                const QuantSpec& spec, std::int64_t block_rows,
                                std::int64_t block_cols) {
  const bool fixed = spec.calibration.method == Calibration::Method::fixed;
  const float static_scale = fixed ? spec.calibration.static_scale(spec.qtype) : 0.0f;
  for (std::int64_t br = 0; br < rows; br += block_rows) {
    for (std::int64_t bc = 0; bc < cols; bc += block_cols) {
      float absmax = 0.0f;
      for (std::int64_t r = br; r < br + block_rows; ++r) {
        for (std::int64_t c = bc; c < bc + block_cols; ++c) {
          absmax = gmm::detail::absmax_update(absmax, static_cast<float>(d[r * cols + c]));
        }
      }
      const float scale = fixed ? static_scale : gmm::detail::absmax_scale(absmax, spec.qtype);
      for (std::int64_t r = br; r < br + block_rows; ++r) {
        for (std::int64_t c = bc; c < bc + block_cols; ++c) {
          double& v = d[r * cols + c];
          const std::uint8_t q =
              gmm::detail::quantize_value(static_cast<float>(v), scale, spec.qtype);
          v = static_cast<double>(gmm::detail::dequantize_value(q, spec.qtype)) * scale;
        }
      }
    }
  }
}

// Dequantized value of stored element (g, r, c) of a grouped operand.
inline double weight(const GroupedMatrix& w, std::int64_t g, std::int64_t r, std::int64_t c) {
  double v = load_as_float(w.data, w.dtype, g * w.group_stride + r * w.row_stride + c);
  if (is_quantized(w.dtype)) v *= scale_at(w.scales, w.rows, w.cols, g, r, c);
  return v;
}

template <typename Out>
void store(Out* base, std::int64_t index, double value, bool accumulate) {
  if (accumulate) value += static_cast<double>(static_cast<float>(base[index]));
  base[index] = static_cast<Out>(static_cast<float>(value));
}

inline void store(void* base, DType dtype, std::int64_t index, double value, bool accumulate) {
  if (dtype == DType::f32) {
    store(static_cast<float*>(base), index, value, accumulate);
  } else {
    store(static_cast<bfloat16*>(base), index, value, accumulate);
  }
}

}  // namespace detail

// fp64 result of a validated gmm problem: value [M, N] and magnitude [M, N]; written per row.
inline Exact gmm_exact(const GmmProblem& p) {
  std::vector<double> a = detail::dense(p.lhs);
  if (p.quantize_lhs)
    detail::quantize_dequantize(a, p.m, p.k, *p.quantize_lhs, 1, p.quantize_lhs->block);
  Exact e{std::vector<double>(p.m * p.n, 0.0), std::vector<double>(p.m * p.n, 0.0),
          std::vector<bool>(p.m, false)};
  for (std::int64_t g = 0; g < p.groups.count(); ++g) {
    for (std::int64_t r = p.groups.begin[g]; r < p.groups.end[g]; ++r) {
      e.written[r] = true;
      for (std::int64_t n = 0; n < p.n; ++n) {
        double sum = 0.0, magnitude = 0.0;
        for (std::int64_t k = 0; k < p.k; ++k) {
          const double w =
              p.transpose_rhs ? detail::weight(p.rhs, g, n, k) : detail::weight(p.rhs, g, k, n);
          sum += a[r * p.k + k] * w;
          magnitude += std::fabs(a[r * p.k + k] * w);
        }
        e.value[r * p.n + n] = sum;
        e.magnitude[r * p.n + n] = magnitude;
      }
    }
  }
  return e;
}

// fp64 result of a validated tgmm problem: value [G, K, N], magnitude [G, K, N]; written per
// group (false only for empty groups).
inline Exact tgmm_exact(const TgmmProblem& p) {
  std::vector<double> a = detail::dense(p.lhs);
  std::vector<double> b = detail::dense(p.rhs);
  if (p.quantize_lhs)
    detail::quantize_dequantize(a, p.m, p.k, *p.quantize_lhs, p.quantize_lhs->block, 1);
  if (p.quantize_rhs)
    detail::quantize_dequantize(b, p.m, p.n, *p.quantize_rhs, p.quantize_rhs->block, 1);
  const std::int64_t groups = p.groups.count();
  Exact e{std::vector<double>(groups * p.k * p.n, 0.0),
          std::vector<double>(groups * p.k * p.n, 0.0), std::vector<bool>(groups, false)};
  for (std::int64_t g = 0; g < groups; ++g) {
    e.written[g] = p.groups.size(g) > 0;
    for (std::int64_t r = p.groups.begin[g]; r < p.groups.end[g]; ++r) {
      for (std::int64_t k = 0; k < p.k; ++k) {
        for (std::int64_t n = 0; n < p.n; ++n) {
          const double t = a[r * p.k + k] * b[r * p.n + n];
          e.value[(g * p.k + k) * p.n + n] += t;
          e.magnitude[(g * p.k + k) * p.n + n] += std::fabs(t);
        }
      }
    }
  }
  return e;
}

// Reference gmm: same contract and errors as gmm::gmm; each output element is the fp64 sum
// rounded once to fp32 (then to bf16 for bf16 outputs).
inline void gmm(const Matrix& lhs, const GroupedMatrix& rhs, GroupSizes group_sizes,
                const OutMatrix& out, const Options& options = {}) {
  const GmmProblem p = make_gmm_problem("gmm::ref::gmm", lhs, rhs, group_sizes, out, options);
  const Exact e = gmm_exact(p);
  for (std::int64_t r = 0; r < p.m; ++r) {
    if (!e.written[r] && p.accumulate) continue;
    for (std::int64_t n = 0; n < p.n; ++n) {
      detail::store(out.data, out.dtype, r * out.row_stride + n, e.value[r * p.n + n],
                    p.accumulate);
    }
  }
}

// Reference tgmm: same contract and errors as gmm::tgmm.
inline void tgmm(const Matrix& lhs, const Matrix& rhs, GroupSizes group_sizes,
                 const OutGroupedMatrix& out, const Options& options = {}) {
  const TgmmProblem p = make_tgmm_problem("gmm::ref::tgmm", lhs, rhs, group_sizes, out, options);
  const Exact e = tgmm_exact(p);
  for (std::int64_t g = 0; g < p.groups.count(); ++g) {
    if (!e.written[g] && p.accumulate) continue;
    for (std::int64_t k = 0; k < p.k; ++k) {
      for (std::int64_t n = 0; n < p.n; ++n) {
        detail::store(out.data, out.dtype, g * out.group_stride + k * out.row_stride + n,
                      e.value[(g * p.k + k) * p.n + n], p.accumulate);
      }
    }
  }
}

}  // namespace gmm::ref
