// Building blocks of the v1 kernels: fp32 tiles of operands, Eigen tile products, per-segment
// scaling, masked stores, and the call's options, buffers and trace.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmm/core/error.hpp"
#include "gmm/core/fp8.hpp"
#include "gmm/core/options.hpp"
#include "gmm/core/parallel.hpp"
#include "gmm/core/quantize.hpp"
#include "gmm/core/view.hpp"
#include "gmm/v1/isa.hpp"

namespace gmm::v1::detail {

// Default (tm, tk, tn) of each op: an fp32 lhs tile, weight tile and accumulator per thread that
// fit a 1-2 MiB L2 together.
constexpr Tiles kGmmTiles{128, 256, 512};
constexpr Tiles kTgmmTiles{256, 256, 256};

// Checks the options v1 does not share with v2 and resolves the tile sizes (0 = default).
inline Tiles resolve_options(const char* where, const Options& options, Tiles defaults) {
  gmm::detail::require(options.isa == Isa::automatic, where, "options.isa",
                       fmt::format("Isa::automatic (family v1 runs Eigen's compile-time "
                                   "vectorization, {}, and cannot be forced)",
                                   name(compiled_isa())),
                       name(options.isa));
  // tiles are >= 0 here: make_gmm_problem / make_tgmm_problem checked them for both families
  const auto pick = [](std::int64_t tile, std::int64_t fallback) {
    return tile == 0 ? fallback : tile;
  };
  return {pick(options.tiles.m, defaults.m), pick(options.tiles.k, defaults.k),
          pick(options.tiles.n, defaults.n)};
}

// An fp32 tile seen row-major: either the operand itself (f32) or a decoded copy in a buffer.
struct FloatTile {
  const float* data;
  std::int64_t stride;
};

// Converts `count` stored elements of dtype `d` to their exact fp32 values.
inline void decode(const void* src, DType d, std::int64_t count, float* dst) {
  switch (d) {
    case DType::f32:
      std::memcpy(dst, src, static_cast<std::size_t>(count) * sizeof(float));
      return;
    case DType::bf16: {
      const auto* s = static_cast<const bfloat16*>(src);
      for (std::int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::float8_e4m3fn:
      return fp8_decode(static_cast<const float8_e4m3fn*>(src), dst, count);
    case DType::float8_e5m2:
      return fp8_decode(static_cast<const float8_e5m2*>(src), dst, count);
    case DType::int8: {
      const auto* s = static_cast<const std::int8_t*>(src);
      for (std::int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
  }
}

// The exact fp32 values of rows [r0, r0 + rows) x cols [c0, c0 + cols) of a stored operand
// (`base` at its first element), decoded once into `buffer` unless the operand is f32 already.
inline FloatTile load_tile(const void* base, DType d, std::int64_t row_stride, std::int64_t r0,
                           std::int64_t rows, std::int64_t c0, std::int64_t cols, float* buffer) {
  const std::int64_t first = r0 * row_stride + c0;
  if (d == DType::f32) return {static_cast<const float*>(base) + first, row_stride};
  const auto* bytes = static_cast<const unsigned char*>(base);
  for (std::int64_t r = 0; r < rows; ++r) {
    decode(bytes + (first + r * row_stride) * size_of(d), d, cols, buffer + r * cols);
  }
  return {buffer, cols};
}

// One worker's fp32 tile products with Eigen's blocked GEMM (packing plus gebp micro-kernel).
// v1 calls Eigen's GEMM driver directly, with no parallel info, rather than Eigen's product front
// end, which opens an OpenMP team of its own per product when the user compiles with OpenMP
// (nested inside v1's workers). The packing buffers live as long as the worker's scratch, and
// the cache blocking comes from the largest product of the call, so a product's summation order
// depends only on its sizes and the tiles, never on the thread count.
class TileGemm {
 public:
  TileGemm(std::int64_t max_rows, std::int64_t max_cols, std::int64_t max_depth)
      : blocking_(std::max<Eigen::Index>(1, max_rows), std::max<Eigen::Index>(1, max_cols),
                  std::max<Eigen::Index>(1, max_depth), 1, true) {
    blocking_.allocateAll();
  }
  TileGemm(const TileGemm&) = delete;
  TileGemm& operator=(const TileGemm&) = delete;

  // acc[rows, cols] (dense, row-major) += a[rows, depth] * b[depth, cols], a and b stored with
  // the given Eigen storage orders and outer strides. Products with one row or column, or tiny
  // ones, go through Eigen's GEMV and coefficient paths (never threaded), as Eigen would.
  template <int AOrder, int BOrder>
  void add(float* acc, std::int64_t rows, std::int64_t cols, std::int64_t depth, FloatTile a,
           FloatTile b) {
    if (rows == 0 || cols == 0 || depth == 0) return;
    if (rows == 1 || cols == 1 || rows + cols + depth < 20) {
      constexpr int kDyn = Eigen::Dynamic;
      using Stride = Eigen::OuterStride<>;
      using AMap = Eigen::Map<const Eigen::Matrix<float, kDyn, kDyn, AOrder>, 0, Stride>;
      using BMap = Eigen::Map<const Eigen::Matrix<float, kDyn, kDyn, BOrder>, 0, Stride>;
      using AccMap = Eigen::Map<Eigen::Matrix<float, kDyn, kDyn, Eigen::RowMajor>>;
      AccMap(acc, rows, cols).noalias() +=
          AMap(a.data, rows, depth, Stride(a.stride)) * BMap(b.data, depth, cols, Stride(b.stride));
      return;
    }
    Eigen::internal::general_matrix_matrix_product<Eigen::Index, float, AOrder, false, float,
                                                   BOrder, false, Eigen::RowMajor,
                                                   1>::run(rows, cols, depth, a.data, a.stride,
                                                           b.data, b.stride, acc, 1, cols, 1.0f,
                                                           blocking_, nullptr);
  }

  std::int64_t bytes() const {
    return static_cast<std::int64_t>((blocking_.mc() + blocking_.nc()) * blocking_.kc() *
                                     sizeof(float));
  }

 private:
  Eigen::internal::gemm_blocking_space<Eigen::RowMajor, float, float, Eigen::Dynamic,
                                       Eigen::Dynamic, Eigen::Dynamic>
      blocking_;
};

// Accumulates one output tile [rows, cols] over a contraction split into segments within
// which both operands' scales are constant: chunk products of a segment are summed exactly as
// Eigen sums them (fp32), then multiplied by s_row * s_col and added to the accumulator. The
// first segment is summed in the accumulator itself and scaled in place; later ones go through
// `partial`. Without scales every chunk is summed straight into the accumulator.
class SegmentAccumulator {
 public:
  SegmentAccumulator(float* acc, float* partial, std::int64_t rows, std::int64_t cols, bool scaled)
      : acc_(acc), partial_(partial), rows_(rows), cols_(cols), scaled_(scaled) {
    std::fill(acc_, acc_ + rows_ * cols_, 0.0f);
  }

  // Starts a segment; its chunk products are then added to target() (dense [rows, cols]).
  void begin_segment() {
    target_ = (scaled_ && segments_ > 0) ? partial_ : acc_;
    if (target_ == partial_) std::fill(partial_, partial_ + rows_ * cols_, 0.0f);
    ++segments_;
  }
  float* target() { return target_; }

  // Ends a segment whose scales are row_scale[rows] and col_scale[cols].
  void end_segment(const float* row_scale, const float* col_scale) {
    if (!scaled_) return;
    const bool first = segments_ == 1;
    for (std::int64_t r = 0; r < rows_; ++r) {
      float* acc = acc_ + r * cols_;
      const float* part = partial_ + r * cols_;
      const float s = row_scale[r];
      if (first) {
        for (std::int64_t c = 0; c < cols_; ++c) acc[c] *= s * col_scale[c];
      } else {
        for (std::int64_t c = 0; c < cols_; ++c) acc[c] += part[c] * (s * col_scale[c]);
      }
    }
  }

  const float* result() const { return acc_; }

 private:
  float* acc_;
  float* partial_;
  float* target_ = nullptr;
  std::int64_t rows_, cols_;
  bool scaled_;
  std::int64_t segments_ = 0;
};

// Scale of element (g, r, c) of a quantized [groups, rows, cols] operand; 1 when unquantized.
inline float scale_of(const Scales& s, std::int64_t rows, std::int64_t cols, std::int64_t g,
                      std::int64_t r, std::int64_t c) {
  if (s.data == nullptr) return 1.0f;
  const std::int64_t row_blocks = rows / s.block.rows, col_blocks = cols / s.block.cols;
  return s
      .data[((g / s.block.groups) * row_blocks + r / s.block.rows) * col_blocks + c / s.block.cols];
}

// Stores an fp32 tile [rows, cols] (dense) into an f32 / bf16 output at `offset` (element
// index of its first element): out = acc, or out = out + acc in fp32 when accumulating; a bf16
// output is rounded once from that fp32 value.
inline void store_tile(void* out, DType d, std::int64_t row_stride, std::int64_t offset,
                       const float* acc, std::int64_t rows, std::int64_t cols, bool accumulate) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* src = acc + r * cols;
    if (d == DType::f32) {
      float* dst = static_cast<float*>(out) + offset + r * row_stride;
      if (accumulate) {
        for (std::int64_t c = 0; c < cols; ++c) dst[c] += src[c];
      } else {
        std::memcpy(dst, src, static_cast<std::size_t>(cols) * sizeof(float));
      }
    } else {
      bfloat16* dst = static_cast<bfloat16*>(out) + offset + r * row_stride;
      if (accumulate) {
        for (std::int64_t c = 0; c < cols; ++c) {
          dst[c] = bfloat16(static_cast<float>(dst[c]) + src[c]);
        }
      } else {
        for (std::int64_t c = 0; c < cols; ++c) dst[c] = bfloat16(src[c]);
      }
    }
  }
}

// Writes +0 into rows [0, rows) x cols [0, cols) of an output at `offset`.
inline void store_zeros(void* out, DType d, std::int64_t row_stride, std::int64_t offset,
                        std::int64_t rows, std::int64_t cols) {
  auto* bytes = static_cast<unsigned char*>(out);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memset(bytes + (offset + r * row_stride) * size_of(d), 0,
                static_cast<std::size_t>(cols) * size_of(d));
  }
}

// Per-thread scratch of a v1 call, sized once before the parallel loop.
struct Scratch {
  std::vector<float> lhs_tile, rhs_tile, acc, partial, row_scale, col_scale;
  std::unique_ptr<TileGemm> gemm;

  std::int64_t bytes() const {
    return static_cast<std::int64_t>((lhs_tile.size() + rhs_tile.size() + acc.size() +
                                      partial.size() + row_scale.size() + col_scale.size()) *
                                     sizeof(float)) +
           gemm->bytes();
  }
};

// Scratch of `workers` threads: decoded operand tiles of the given element counts (0 when the
// operand is read in place), an accumulator [acc_rows, acc_cols], GEMM packing buffers for
// products of depth up to `max_depth`, and when `scaled` the per-segment scales plus, when there
// are several segments, a partial sum.
inline std::vector<Scratch> make_scratch(int workers, std::int64_t lhs_tile, std::int64_t rhs_tile,
                                         std::int64_t acc_rows, std::int64_t acc_cols,
                                         std::int64_t max_depth, bool scaled,
                                         bool several_segments) {
  std::vector<Scratch> scratch(static_cast<std::size_t>(workers));
  const auto size = [](std::int64_t n) { return static_cast<std::size_t>(n); };
  for (Scratch& s : scratch) {
    s.lhs_tile.resize(size(lhs_tile));
    s.rhs_tile.resize(size(rhs_tile));
    s.acc.resize(size(acc_rows * acc_cols));
    if (scaled && several_segments) s.partial.resize(size(acc_rows * acc_cols));
    if (scaled) s.row_scale.resize(size(acc_rows));
    if (scaled) s.col_scale.resize(size(acc_cols));
    s.gemm = std::make_unique<TileGemm>(acc_rows, acc_cols, max_depth);
  }
  return scratch;
}

// v1 quantizes outside the kernel: an f32 / bf16 operand is quantized with one scale per
// `block` (or fixed calibration's static per-tensor scale) into `storage`, and the kernel reads
// the returned view of it.
inline Matrix materialize(const Matrix& x, const QuantSpec& spec, BlockShape block, int threads,
                          QArray& storage) {
  storage = quantize(x, spec.qtype, block, spec.calibration, threads);
  return storage.matrix();
}

inline OperandTrace operand_trace(DType dtype, const Scales& scales, bool quantized_here) {
  OperandTrace t;
  t.dtype = dtype;
  t.quantized = is_quantized(dtype);
  if (t.quantized) {
    t.block = scales.block;
    t.quantized_by = quantized_here ? "outside kernel" : "caller";
  }
  return t;
}

// Fills *trace (when non-null) with what a v1 call ran; extra bytes are the materialized
// operands plus every thread's scratch.
inline void fill_trace(CallTrace* trace, const char* op, Tiles tiles, int threads, OperandTrace lhs,
                       OperandTrace rhs, const std::vector<QArray*>& materialized,
                       const std::vector<Scratch>& scratch) {
  if (trace == nullptr) return;
  CallTrace t;
  t.op = op;
  t.family = Family::v1;
  t.isa = compiled_isa();
  t.tiles = tiles;
  t.threads = threads;
  t.lhs = std::move(lhs);
  t.rhs = std::move(rhs);
  for (const QArray* q : materialized) {
    t.extra_bytes += static_cast<std::int64_t>(q->qvalue.size() + q->scale.size() * sizeof(float));
  }
  for (const Scratch& s : scratch) t.extra_bytes += s.bytes();
  *trace = std::move(t);
}

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace gmm::v1::detail
