// Owned test operands and outputs of any dtype, with scales, padding and random contents.
//
// Usage: `OwnedMatrix x = random_matrix(rng, DType::float8_e4m3fn, M, K, {1, 1, 128});` gives an
// fp8 [M, K] operand with one random scale per 1 x 128 block; `x.view()` is the gmm::Matrix.
// `random_grouped(rng, DType::int8, G, K, N, {1, 0, 1}, /*row_pad=*/3)` gives per-channel int8
// weights [G, K, N] whose rows are padded by 3 elements. In a BlockShape passed here, 0 means
// "the whole extent of that axis" (so {0, 0, 0} is per tensor). Padding is filled with NaN (or an
// out-of-range code), so a kernel reading past `cols` shows up. `make_output` / `random_output`
// give f32 or bf16 outputs whose padding holds a sentinel checked by compare.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <utility>
#include <vector>

#include "gmm/core/dtype.hpp"
#include "gmm/core/view.hpp"
#include "support/random.hpp"

namespace gmm::test {

// Stores `value` as element `index` of a buffer of dtype `d` (fp8 rounds to nearest even without
// saturation, int8 rounds to nearest).
inline void store_as(void* base, DType d, std::int64_t index, float value) {
  switch (d) {
    case DType::f32:
      static_cast<float*>(base)[index] = value;
      return;
    case DType::bf16:
      static_cast<bfloat16*>(base)[index] = bfloat16(value);
      return;
    case DType::float8_e4m3fn:
      static_cast<float8_e4m3fn*>(base)[index] = float8_e4m3fn(value);
      return;
    case DType::float8_e5m2:
      static_cast<float8_e5m2*>(base)[index] = float8_e5m2(value);
      return;
    case DType::int8:
      static_cast<std::int8_t*>(base)[index] = static_cast<std::int8_t>(std::lround(value));
      return;
  }
}

// What padding elements hold: NaN for float types, -128 (never produced by symmetric int8
// quantization) for int8.
inline float padding_value(DType d) {
  return d == DType::int8 ? -128.0f : std::numeric_limits<float>::quiet_NaN();
}

// Resolves a test BlockShape (0 = whole extent) against [groups, rows, cols].
inline BlockShape resolve_block(BlockShape b, std::int64_t groups, std::int64_t rows,
                                std::int64_t cols) {
  auto whole = [](std::int64_t extent, std::int64_t dim) {
    return extent > 0 ? extent : std::max<std::int64_t>(1, dim);
  };
  return {whole(b.groups, groups), whole(b.rows, rows), whole(b.cols, cols)};
}

// Storage behind a 2-D (groups == 1) or grouped operand: elements, padding and fp32 scales.
struct OwnedMatrix {
  DType dtype = DType::f32;
  std::int64_t groups = 1, rows = 0, cols = 0, row_stride = 0, group_stride = 0;
  BlockShape block;                 // scale block; meaningful for quantized dtypes
  std::vector<std::uint8_t> bytes;  // groups * group_stride elements
  std::vector<float> scales;        // empty unless quantized

  std::int64_t index(std::int64_t g, std::int64_t r, std::int64_t c) const {
    return g * group_stride + r * row_stride + c;
  }
  float stored(std::int64_t g, std::int64_t r, std::int64_t c) const {
    return load_as_float(bytes.data(), dtype, index(g, r, c));
  }
  void set(std::int64_t g, std::int64_t r, std::int64_t c, float value) {
    store_as(bytes.data(), dtype, index(g, r, c), value);
  }
  // The scale of element (g, r, c).
  float& scale(std::int64_t g, std::int64_t r, std::int64_t c) {
    const std::int64_t block_rows = rows / block.rows, block_cols = cols / block.cols;
    return scales[((g / block.groups) * block_rows + r / block.rows) * block_cols + c / block.cols];
  }
  // The scales as a view: none when `scales` is empty (whatever the dtype).
  Scales scale_view() const { return scales.empty() ? Scales{} : Scales{scales.data(), block}; }
  Matrix view() const { return {bytes.data(), dtype, rows, cols, row_stride, scale_view()}; }
  GroupedMatrix grouped_view() const {
    return {bytes.data(), dtype, groups, rows, cols, group_stride, row_stride, scale_view()};
  }
};

// An operand [groups, rows, cols] of dtype `d` filled by value(g, r, c); quantized dtypes get
// `scales` (one per block, or all ones when empty). Rows are padded by `row_pad` elements and
// groups by `group_pad` elements.
template <typename Value>
OwnedMatrix make_matrix(DType d, std::int64_t groups, std::int64_t rows, std::int64_t cols,
                        Value&& value, BlockShape block = {0, 0, 0}, std::vector<float> scales = {},
                        std::int64_t row_pad = 0, std::int64_t group_pad = 0) {
  OwnedMatrix m;
  m.dtype = d;
  m.groups = groups;
  m.rows = rows;
  m.cols = cols;
  m.row_stride = cols + row_pad;
  m.group_stride = rows * m.row_stride + group_pad;
  m.block = resolve_block(block, groups, rows, cols);
  const std::int64_t elements = std::max<std::int64_t>(1, groups * m.group_stride);
  m.bytes.resize(static_cast<std::size_t>(elements * size_of(d)));
  for (std::int64_t i = 0; i < elements; ++i) store_as(m.bytes.data(), d, i, padding_value(d));
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) m.set(g, r, c, value(g, r, c));
    }
  }
  if (is_quantized(d)) {
    const std::int64_t count =
        (groups / m.block.groups) * (rows / m.block.rows) * (cols / m.block.cols);
    m.scales = scales.empty() ? std::vector<float>(static_cast<std::size_t>(count), 1.0f)
                              : std::move(scales);
  }
  return m;
}

// A 2-D operand [rows, cols] from row-major `values` (exactly representable in `d`).
inline OwnedMatrix matrix_from(DType d, std::int64_t rows, std::int64_t cols,
                               const std::vector<float>& values, BlockShape block = {0, 0, 0},
                               std::vector<float> scales = {}) {
  return make_matrix(
      d, 1, rows, cols,
      [&](std::int64_t, std::int64_t r, std::int64_t c) { return values[r * cols + c]; }, block,
      std::move(scales));
}

// A grouped operand [groups, rows, cols] from row-major `values`.
inline OwnedMatrix grouped_from(DType d, std::int64_t groups, std::int64_t rows, std::int64_t cols,
                                const std::vector<float>& values, BlockShape block = {0, 0, 0},
                                std::vector<float> scales = {}) {
  return make_matrix(
      d, groups, rows, cols,
      [&](std::int64_t g, std::int64_t r, std::int64_t c) {
        return values[(g * rows + r) * cols + c];
      },
      block, std::move(scales));
}

// A random grouped operand (see random_value / random_scale).
inline OwnedMatrix random_grouped(Rng& rng, DType d, std::int64_t groups, std::int64_t rows,
                                  std::int64_t cols, BlockShape block = {0, 0, 0},
                                  std::int64_t row_pad = 0, std::int64_t group_pad = 0) {
  OwnedMatrix m = make_matrix(
      d, groups, rows, cols,
      [&](std::int64_t, std::int64_t, std::int64_t) { return random_value(rng, d); }, block, {},
      row_pad, group_pad);
  for (float& s : m.scales) s = random_scale(rng);
  return m;
}

// A random 2-D operand [rows, cols].
inline OwnedMatrix random_matrix(Rng& rng, DType d, std::int64_t rows, std::int64_t cols,
                                 BlockShape block = {0, 0, 0}, std::int64_t row_pad = 0) {
  return random_grouped(rng, d, 1, rows, cols, block, row_pad);
}

// Sentinel held by output padding: a kernel writing past `cols` changes it.
constexpr float kOutputPadding = -31337.0f;

// Allocates on cache lines (64 bytes), so whether an output's rows start on lines depends on
// its row stride only (v2 streams large outputs past the caches when they do).
template <typename T>
struct LineAlignedAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  LineAlignedAllocator() = default;
  template <typename U>
  LineAlignedAllocator(const LineAlignedAllocator<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlignment)); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, kAlignment); }
  template <typename U>
  bool operator==(const LineAlignedAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const LineAlignedAllocator<U>&) const {
    return false;
  }
};

// An f32 / bf16 output [groups, rows, cols] (groups == 1 for gmm) with padded rows, starting
// `offset` elements past a cache line (and followed by as many padding elements).
struct OwnedOutput {
  DType dtype = DType::f32;
  std::int64_t groups = 1, rows = 0, cols = 0, row_stride = 0, group_stride = 0, offset = 0;
  std::vector<std::uint8_t, LineAlignedAllocator<std::uint8_t>> bytes;

  std::int64_t index(std::int64_t g, std::int64_t r, std::int64_t c) const {
    return offset + g * group_stride + r * row_stride + c;
  }
  void* data() { return bytes.data() + offset * static_cast<std::int64_t>(size_of(dtype)); }
  float at(std::int64_t g, std::int64_t r, std::int64_t c) const {
    return load_as_float(bytes.data(), dtype, index(g, r, c));
  }
  void set(std::int64_t g, std::int64_t r, std::int64_t c, float value) {
    store_as(bytes.data(), dtype, index(g, r, c), value);
  }
  OutMatrix view() { return {data(), dtype, rows, cols, row_stride}; }
  OutGroupedMatrix grouped_view() {
    return {data(), dtype, groups, rows, cols, group_stride, row_stride};
  }
};

// An output whose elements all hold `fill` (a sentinel for "nothing written" checks, or the
// previous contents for accumulate) and whose padding holds kOutputPadding.
inline OwnedOutput make_output(DType d, std::int64_t groups, std::int64_t rows, std::int64_t cols,
                               float fill, std::int64_t row_pad = 0, std::int64_t offset = 0) {
  OwnedOutput o;
  o.dtype = d;
  o.groups = groups;
  o.rows = rows;
  o.cols = cols;
  o.row_stride = cols + row_pad;
  o.group_stride = rows * o.row_stride;
  o.offset = offset;
  const std::int64_t elements = std::max<std::int64_t>(1, groups * o.group_stride) + 2 * offset;
  o.bytes.resize(static_cast<std::size_t>(elements * size_of(d)));
  for (std::int64_t i = 0; i < elements; ++i) store_as(o.bytes.data(), d, i, kOutputPadding);
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) o.set(g, r, c, fill);
    }
  }
  return o;
}

// An output holding random N(0, 1) values (previous contents for accumulate tests).
inline OwnedOutput random_output(Rng& rng, DType d, std::int64_t groups, std::int64_t rows,
                                 std::int64_t cols, std::int64_t row_pad = 0,
                                 std::int64_t offset = 0) {
  OwnedOutput o = make_output(d, groups, rows, cols, 0.0f, row_pad, offset);
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) o.set(g, r, c, static_cast<float>(rng.normal()));
    }
  }
  return o;
}

}  // namespace gmm::test
