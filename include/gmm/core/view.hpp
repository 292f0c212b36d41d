// Type-erased, row-major views of operands and outputs, with their scales and group sizes.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <vector>

#include "gmm/core/dtype.hpp"
#include "gmm/core/error.hpp"

namespace gmm {

// Extents of one scale block over a (grouped) matrix: one fp32 scale per
// groups x rows x cols tile (CuTe's stride-0 idea). Per-tensor is the whole array; per-row of
// [M,K] is {1,1,K}; 1x128 sub-channel is {1,1,128}; per-channel weights of [G,K,N] are {1,K,1}
// per expert or {G,K,1} shared across experts; 128x128 block-wise weights are {1,128,128}.
// For a 2-D operand `groups` is 1.
struct BlockShape {
  std::int64_t groups = 1;
  std::int64_t rows = 1;
  std::int64_t cols = 1;
  friend bool operator==(const BlockShape& a, const BlockShape& b) {
    return a.groups == b.groups && a.rows == b.rows && a.cols == b.cols;
  }
  friend bool operator!=(const BlockShape& a, const BlockShape& b) { return !(a == b); }
};

// fp32 scales of a quantized operand: a dense row-major array of shape
// [groups / block.groups, rows / block.rows, cols / block.cols]. data == nullptr means the
// operand is not quantized.
struct Scales {
  const float* data = nullptr;
  BlockShape block;
};

// A read-only 2-D operand [rows, cols] (activations, output gradients). Quantized dtypes
// (fp8, int8) carry their scales; f32 and bf16 carry none.
struct Matrix {
  const void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t row_stride = 0;  // elements between consecutive rows
  Scales scales;
};

// A read-only stack of per-expert matrices [groups, rows, cols] (weights).
struct GroupedMatrix {
  const void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t groups = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t group_stride = 0;  // elements between consecutive groups
  std::int64_t row_stride = 0;
  Scales scales;
};

// A writable 2-D output, f32 or bf16.
struct OutMatrix {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t row_stride = 0;
};

// A writable grouped output [groups, rows, cols], f32 or bf16.
struct OutGroupedMatrix {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t groups = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t group_stride = 0;
  std::int64_t row_stride = 0;
};

// Tokens per expert, int32 as in every MoE router: the E global experts' group sizes.
struct GroupSizes {
  const std::int32_t* data = nullptr;
  std::int64_t count = 0;
  GroupSizes() = default;
  GroupSizes(const std::int32_t* d, std::int64_t n) : data(d), count(n) {}
  GroupSizes(const std::vector<std::int32_t>& v)  // NOLINT: implicit by design
      : data(v.data()), count(static_cast<std::int64_t>(v.size())) {}
  std::int32_t operator[](std::int64_t i) const { return data[i]; }
};

// ---- Typed constructors from raw pointers -------------------------------------------------

template <typename T>
Matrix view(const T* data, std::int64_t rows, std::int64_t cols, std::int64_t row_stride = -1,
            Scales scales = {}) {
  return {data, dtype_for<T>::value, rows, cols, row_stride < 0 ? cols : row_stride, scales};
}

template <typename T>
GroupedMatrix grouped_view(const T* data, std::int64_t groups, std::int64_t rows, std::int64_t cols,
                           Scales scales = {}) {
  return {data, dtype_for<T>::value, groups, rows, cols, rows * cols, cols, scales};
}

template <typename T>
OutMatrix out_view(T* data, std::int64_t rows, std::int64_t cols, std::int64_t row_stride = -1) {
  return {data, dtype_for<T>::value, rows, cols, row_stride < 0 ? cols : row_stride};
}

template <typename T>
OutGroupedMatrix out_grouped_view(T* data, std::int64_t groups, std::int64_t rows,
                                  std::int64_t cols) {
  return {data, dtype_for<T>::value, groups, rows, cols, rows * cols, cols};
}

// ---- Adapters from Eigen row-major matrices and maps ---------------------------------------

template <typename T>
using RowMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <typename Derived>
Matrix view(const Eigen::PlainObjectBase<Derived>& m, Scales scales = {}) {
  static_assert(Derived::IsRowMajor, "gmm views need row-major Eigen matrices");
  return view(m.data(), m.rows(), m.cols(), m.outerStride(), scales);
}

template <typename T, int Options, typename Stride>
Matrix view(const Eigen::Map<T, Options, Stride>& m, Scales scales = {}) {
  static_assert(T::IsRowMajor, "gmm views need row-major Eigen maps");
  return view(m.data(), m.rows(), m.cols(), m.outerStride(), scales);
}

template <typename Derived>
OutMatrix out_view(Eigen::PlainObjectBase<Derived>& m) {
  static_assert(Derived::IsRowMajor, "gmm views need row-major Eigen matrices");
  return out_view(m.data(), m.rows(), m.cols(), m.outerStride());
}

namespace detail {

// The rows of each of `groups` equal blocks of a matrix of `rows` rows; a gmm::Error unless
// `groups` divides them (no rows are left out).
inline std::int64_t rows_per_group(const char* where, std::int64_t rows, std::int64_t groups) {
  require(groups > 0 ? rows % groups == 0 : groups == 0 && rows == 0, where, "groups",
          fmt::format("a positive divisor of the matrix's {} rows", rows), groups);
  return groups > 0 ? rows / groups : 0;
}

}  // namespace detail

// A [groups * rows, cols] row-major Eigen matrix seen as `groups` stacked [rows, cols] blocks
// (a gmm::Error unless `groups` divides its rows).
template <typename Derived>
GroupedMatrix grouped_view(const Eigen::PlainObjectBase<Derived>& m, std::int64_t groups,
                           Scales scales = {}) {
  static_assert(Derived::IsRowMajor, "gmm views need row-major Eigen matrices");
  const std::int64_t rows = detail::rows_per_group("gmm::grouped_view", m.rows(), groups);
  return {m.data(),        dtype_for<typename Derived::Scalar>::value,
          groups,          rows,
          m.cols(),        rows * m.outerStride(),
          m.outerStride(), scales};
}

template <typename Derived>
OutGroupedMatrix out_grouped_view(Eigen::PlainObjectBase<Derived>& m, std::int64_t groups) {
  static_assert(Derived::IsRowMajor, "gmm views need row-major Eigen matrices");
  const std::int64_t rows = detail::rows_per_group("gmm::out_grouped_view", m.rows(), groups);
  return {m.data(),       dtype_for<typename Derived::Scalar>::value,
          groups,         rows,
          m.cols(),       rows * m.outerStride(),
          m.outerStride()};
}

}  // namespace gmm
