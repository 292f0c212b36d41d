// gmm::quantize and gmm::dequantize: Qwix-compatible quantization of 2-D and grouped operands.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gmm/core/calibration.hpp"
#include "gmm/core/error.hpp"
#include "gmm/core/parallel.hpp"
#include "gmm/core/problem.hpp"
#include "gmm/core/qvalue.hpp"
#include "gmm/core/view.hpp"

namespace gmm {

// A quantized tensor, Qwix's QArray: one stored byte per value (fp8 code or two's complement
// int8) and one fp32 scale per block; value = dequantize(q) * scale. The shape is
// [groups, rows, cols] (groups == 1 for a 2-D matrix); `scale` is the dense row-major array
// [groups / block.groups, rows / block.rows, cols / block.cols].
struct QArray {
  QType qtype = QType::float8_e4m3fn;
  std::int64_t groups = 1;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  BlockShape block;
  std::vector<std::uint8_t> qvalue;
  std::vector<float> scale;

  Scales scales() const { return {scale.data(), block}; }
  // The 2-D operand view, scales attached, that gmm::gmm and gmm::tgmm take (groups == 1).
  Matrix matrix() const {
    detail::require(groups == 1, "gmm::QArray::matrix", "groups", "1 (a 2-D tensor)", groups);
    return {qvalue.data(), dtype_of(qtype), rows, cols, cols, scales()};
  }
  // The grouped operand view (weights), scales attached.
  GroupedMatrix grouped() const {
    return {qvalue.data(), dtype_of(qtype), groups, rows, cols, rows * cols, cols, scales()};
  }
};

// Scale block shapes by name. An extent of 0 stands for the whole axis; gmm::quantize resolves
// it against the operand's shape.
namespace blocks {
// One scale for the whole tensor.
inline constexpr BlockShape per_tensor{0, 0, 0};
// One scale per row: [M, K] -> scales [M, 1]; [G, R, C] -> [G, R, 1].
inline constexpr BlockShape per_row{1, 1, 0};
// One scale per column (of each group): [M, N] -> [1, N]; weights [G, K, N] -> [G, 1, N].
inline constexpr BlockShape per_column{1, 0, 1};
// One scale per column shared by all groups, as Qwix does for weights: [G, K, N] -> [1, 1, N].
inline constexpr BlockShape per_column_shared{0, 0, 1};
// rows x cols tiles in each group: 1 x 128 sub-channel activations, 128 x 128 weight blocks.
constexpr BlockShape tile(std::int64_t rows, std::int64_t cols) { return {1, rows, cols}; }
}  // namespace blocks

// fp32 scales with the shape of their own array, as Qwix stores them: one scale per
// (groups / this.groups) x (rows / this.rows) x (cols / this.cols) block of the operand.
struct ScaleArray {
  const float* data = nullptr;
  std::int64_t groups = 1;
  std::int64_t rows = 1;
  std::int64_t cols = 1;
};

namespace detail {

inline GroupedMatrix as_grouped(const Matrix& x) {
  return {x.data, x.dtype, 1, x.rows, x.cols, x.rows * x.row_stride, x.row_stride, x.scales};
}

inline OutGroupedMatrix as_grouped(const OutMatrix& x) {
  return {x.data, x.dtype, 1, x.rows, x.cols, x.rows * x.row_stride, x.row_stride};
}

inline std::int64_t scale_count(std::int64_t groups, std::int64_t rows, std::int64_t cols,
                                BlockShape block) {
  return (groups / block.groups) * (rows / block.rows) * (cols / block.cols);
}

inline void check_grouped(const char* where, std::string_view name, const void* data,
                          std::int64_t groups, std::int64_t rows, std::int64_t cols,
                          std::int64_t group_stride, std::int64_t row_stride) {
  require(groups >= 0, where, fmt::format("{} groups", name), ">= 0", groups);
  check_matrix(where, name, data, groups * rows, cols, row_stride);
  require(groups <= 1 || group_stride >= rows * row_stride, where,
          fmt::format("{} group_stride", name),
          fmt::format(">= rows * row_stride = {}", rows * row_stride), group_stride);
}

inline void check_quantize_input(const char* where, const GroupedMatrix& x) {
  require(x.dtype == DType::f32 || x.dtype == DType::bf16, where, "x dtype", "f32 or bf16",
          x.dtype);
  check_grouped(where, "x", x.data, x.groups, x.rows, x.cols, x.group_stride, x.row_stride);
}

// How a validated quantization runs: the resolved block and where its scales come from (absmax
// of each block, the static scale of fixed calibration, or the caller).
struct QuantizePlan {
  enum class ScaleSource : std::uint8_t { absmax, fixed, given };
  BlockShape block;
  ScaleSource source = ScaleSource::absmax;
  float static_scale = 0.0f;  // fixed only
};

// Validates a quantization and resolves its block: 0 extents become the whole axis, every
// extent must divide its axis, and fixed calibration is per tensor whatever `block` says.
inline QuantizePlan plan_quantize(const char* where, const GroupedMatrix& x, QType qtype,
                                  BlockShape block, const Calibration& calibration) {
  check_quantize_input(where, x);
  QuantizePlan plan;
  if (calibration.method == Calibration::Method::fixed) {
    plan.source = QuantizePlan::ScaleSource::fixed;
    plan.static_scale = calibration.static_scale(qtype);
    block = BlockShape{0, 0, 0};
  }
  const auto resolve = [&](std::int64_t extent, std::int64_t dim, const char* axis) {
    require(extent >= 0, where, fmt::format("block extent along {}", axis),
            "0 (the whole axis) or a positive divisor of the axis", extent);
    if (extent == 0) return std::max<std::int64_t>(dim, 1);
    check_block(where, "x", axis, extent, dim);
    return extent;
  };
  plan.block = {resolve(block.groups, x.groups, "groups"), resolve(block.rows, x.rows, "rows"),
                resolve(block.cols, x.cols, "cols")};
  return plan;
}

// Checks that a scale array has one finite positive value per block.
inline void check_scale_values(const char* where, const float* scale, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {  // the message is formatted only on failure
    if (!(std::isfinite(scale[i]) && scale[i] > 0.0f)) {
      fail(where, fmt::format("scale[{}]", i), "a finite positive value", scale[i]);
    }
  }
}

// max|x| over each column block of one band (a group block x a row block), written to `absmax`.
// Rows are walked in storage order.
template <typename From>
void band_absmax(const GroupedMatrix& x, BlockShape block, std::int64_t group_block,
                 std::int64_t row_block, float* absmax) {
  const std::int64_t col_blocks = x.cols / block.cols;
  std::fill(absmax, absmax + col_blocks, 0.0f);
  for (std::int64_t g = group_block * block.groups; g < (group_block + 1) * block.groups; ++g) {
    for (std::int64_t r = row_block * block.rows; r < (row_block + 1) * block.rows; ++r) {
      const From* row = static_cast<const From*>(x.data) + g * x.group_stride + r * x.row_stride;
      for (std::int64_t cb = 0; cb < col_blocks; ++cb) {
        absmax[cb] = absmax_update(absmax[cb], row + cb * block.cols, block.cols);
      }
    }
  }
}

template <typename From>
void compute_scales(const GroupedMatrix& x, QType qtype, BlockShape block, float* scale,
                    int threads) {
  const std::int64_t row_blocks = x.rows / block.rows;
  const std::int64_t col_blocks = x.cols / block.cols;
  parallel_for((x.groups / block.groups) * row_blocks, threads, [&](std::int64_t band, int) {
    float* band_scale = scale + band * col_blocks;
    band_absmax<From>(x, block, band / row_blocks, band % row_blocks, band_scale);
    for (std::int64_t cb = 0; cb < col_blocks; ++cb) {
      band_scale[cb] = absmax_scale(band_scale[cb], qtype);
    }
  });
}

// Rows of work per task of the element-wise passes.
inline constexpr std::int64_t kRowsPerTask = 16;

// Calls body(g, row_begin, row_end) over the rows of every group, in parallel.
template <typename Body>
void for_row_chunks(std::int64_t groups, std::int64_t rows, int threads, Body&& body) {
  const std::int64_t chunks = (rows + kRowsPerTask - 1) / kRowsPerTask;
  parallel_for(groups * chunks, threads, [&](std::int64_t task, int) {
    const std::int64_t begin = (task % chunks) * kRowsPerTask;
    body(task / chunks, begin, std::min(begin + kRowsPerTask, rows));
  });
}

// q = quantize_value(x, scale of its block) for rows [row_begin, row_end) of group g; qvalue is
// dense [groups, rows, cols].
template <QType kQType, typename From>
void quantize_rows(const GroupedMatrix& x, BlockShape block, const float* scale, std::int64_t g,
                   std::int64_t row_begin, std::int64_t row_end, std::uint8_t* qvalue) {
  const std::int64_t col_blocks = x.cols / block.cols;
  const std::int64_t row_blocks = x.rows / block.rows;
  for (std::int64_t r = row_begin; r < row_end; ++r) {
    const From* row = static_cast<const From*>(x.data) + g * x.group_stride + r * x.row_stride;
    const float* row_scale =
        scale + ((g / block.groups) * row_blocks + r / block.rows) * col_blocks;
    std::uint8_t* out = qvalue + (g * x.rows + r) * x.cols;
    for (std::int64_t cb = 0; cb < col_blocks; ++cb) {
      const float s = row_scale[cb];
      for (std::int64_t c = cb * block.cols; c < (cb + 1) * block.cols; ++c) {
        out[c] = quantize_value<kQType>(static_cast<float>(row[c]), s);
      }
    }
  }
}

template <typename From>
void quantize_with(const GroupedMatrix& x, QType qtype, BlockShape block, const float* scale,
                   std::uint8_t* qvalue, int threads) {
  for_row_chunks(x.groups, x.rows, threads, [&](std::int64_t g, std::int64_t b, std::int64_t e) {
    switch (qtype) {
      case QType::float8_e4m3fn:
        return quantize_rows<QType::float8_e4m3fn, From>(x, block, scale, g, b, e, qvalue);
      case QType::float8_e5m2:
        return quantize_rows<QType::float8_e5m2, From>(x, block, scale, g, b, e, qvalue);
      case QType::int8:
        return quantize_rows<QType::int8, From>(x, block, scale, g, b, e, qvalue);
    }
  });
}

// Runs a validated plan into dense qvalue / scale buffers (`scale` holds the scales already
// when they are given).
template <typename From>
void run_quantize(const GroupedMatrix& x, QType qtype, const QuantizePlan& plan, float* scale,
                  std::uint8_t* qvalue, int threads) {
  switch (plan.source) {
    case QuantizePlan::ScaleSource::absmax:
      compute_scales<From>(x, qtype, plan.block, scale, threads);
      break;
    case QuantizePlan::ScaleSource::fixed:
      scale[0] = plan.static_scale;
      break;
    case QuantizePlan::ScaleSource::given:
      break;
  }
  quantize_with<From>(x, qtype, plan.block, scale, qvalue, threads);
}

inline void run_quantize(const GroupedMatrix& x, QType qtype, const QuantizePlan& plan,
                         float* scale, std::uint8_t* qvalue, int threads) {
  if (x.groups * x.rows * x.cols == 0) return;
  if (x.dtype == DType::f32) {
    run_quantize<float>(x, qtype, plan, scale, qvalue, threads);
  } else {
    run_quantize<bfloat16>(x, qtype, plan, scale, qvalue, threads);
  }
}

inline QArray empty_qarray(const GroupedMatrix& x, QType qtype, BlockShape block) {
  QArray q;
  q.qtype = qtype;
  q.groups = x.groups;
  q.rows = x.rows;
  q.cols = x.cols;
  q.block = block;
  q.qvalue.resize(static_cast<std::size_t>(x.groups * x.rows * x.cols));
  q.scale.resize(static_cast<std::size_t>(scale_count(x.groups, x.rows, x.cols, block)));
  return q;
}

inline void check_2d_block(const char* where, BlockShape block) {
  require(block.groups <= 1, where, "block extent along groups", "0 or 1 for a 2-D operand",
          block.groups);
}

// out = dequantize_value(q) * scale in fp32, rounded once more for a bf16 output.
template <QType kQType, typename Out>
void dequantize_rows(const GroupedMatrix& q, const OutGroupedMatrix& out, std::int64_t g,
                     std::int64_t row_begin, std::int64_t row_end) {
  const BlockShape block = q.scales.block;
  const std::int64_t col_blocks = q.cols / block.cols;
  const std::int64_t row_blocks = q.rows / block.rows;
  for (std::int64_t r = row_begin; r < row_end; ++r) {
    const auto* in =
        static_cast<const std::uint8_t*>(q.data) + g * q.group_stride + r * q.row_stride;
    Out* dst = static_cast<Out*>(out.data) + g * out.group_stride + r * out.row_stride;
    const float* row_scale =
        q.scales.data + ((g / block.groups) * row_blocks + r / block.rows) * col_blocks;
    for (std::int64_t cb = 0; cb < col_blocks; ++cb) {
      const float s = row_scale[cb];
      for (std::int64_t c = cb * block.cols; c < (cb + 1) * block.cols; ++c) {
        dst[c] = static_cast<Out>(dequantize_value<kQType>(in[c]) * s);
      }
    }
  }
}

template <typename Out>
void dequantize_validated(const GroupedMatrix& q, const OutGroupedMatrix& out, int threads) {
  const QType qtype = qtype_of(q.dtype);
  for_row_chunks(q.groups, q.rows, threads, [&](std::int64_t g, std::int64_t b, std::int64_t e) {
    switch (qtype) {
      case QType::float8_e4m3fn:
        return dequantize_rows<QType::float8_e4m3fn, Out>(q, out, g, b, e);
      case QType::float8_e5m2:
        return dequantize_rows<QType::float8_e5m2, Out>(q, out, g, b, e);
      case QType::int8:
        return dequantize_rows<QType::int8, Out>(q, out, g, b, e);
    }
  });
}

}  // namespace detail

// Quantizes x ([groups, rows, cols], f32 or bf16) with one scale per `block` (see gmm::blocks;
// 0 extents are the whole axis), Qwix's rules:
//   absmax: scale = max|x| over the block / qmax in fp32, 1 when below sqrt(FLT_MIN);
//   fixed:  one per-tensor scale MAX / qmax whatever `block` says (as Qwix);
//   q = cast(clip(x / scale, -qmax, qmax)), fp8 round-to-nearest-even, int8 half-to-even.
// The result's block is the resolved one. Results do not depend on `threads` (0 = all hardware
// threads). Throws gmm::Error on bad input: a block extent that does not divide its axis, an
// unquantizable dtype, a fixed scale below sqrt(FLT_MIN).
inline QArray quantize(const GroupedMatrix& x, QType qtype, BlockShape block,
                       const Calibration& calibration = Calibration::absmax(), int threads = 1) {
  const detail::QuantizePlan plan =
      detail::plan_quantize("gmm::quantize", x, qtype, block, calibration);
  QArray q = detail::empty_qarray(x, qtype, plan.block);
  detail::run_quantize(x, qtype, plan, q.scale.data(), q.qvalue.data(), resolve_threads(threads));
  return q;
}

// A 2-D operand [rows, cols] (block.groups must be 0 or 1).
inline QArray quantize(const Matrix& x, QType qtype, BlockShape block,
                       const Calibration& calibration = Calibration::absmax(), int threads = 1) {
  detail::check_2d_block("gmm::quantize", block);
  return quantize(detail::as_grouped(x), qtype, block, calibration, threads);
}

// As gmm::quantize, into caller-owned buffers: `qvalue` dense [groups, rows, cols] and `scale`
// with one value per block of the returned (resolved) block shape. Nothing is written when it
// throws.
inline BlockShape quantize_into(const GroupedMatrix& x, QType qtype, BlockShape block,
                                const Calibration& calibration, std::uint8_t* qvalue, float* scale,
                                int threads = 1) {
  const detail::QuantizePlan plan =
      detail::plan_quantize("gmm::quantize_into", x, qtype, block, calibration);
  detail::run_quantize(x, qtype, plan, scale, qvalue, resolve_threads(threads));
  return plan.block;
}

inline BlockShape quantize_into(const Matrix& x, QType qtype, BlockShape block,
                                const Calibration& calibration, std::uint8_t* qvalue, float* scale,
                                int threads = 1) {
  detail::check_2d_block("gmm::quantize_into", block);
  return quantize_into(detail::as_grouped(x), qtype, block, calibration, qvalue, scale, threads);
}

// Quantizes x with given scales (Qwix's quantize_with_scale_zero_point, symmetric): the block
// of each scale is x's shape divided by the scale array's shape. Throws gmm::Error when the
// scale shape does not divide x's shape or a scale is not finite and positive.
inline QArray quantize_with_scales(const GroupedMatrix& x, QType qtype, const ScaleArray& scales,
                                   int threads = 1) {
  constexpr const char* where = "gmm::quantize_with_scales";
  detail::check_quantize_input(where, x);
  const auto divides = [](std::int64_t s, std::int64_t dim) { return s >= 1 && dim % s == 0; };
  detail::require(
      scales.data != nullptr && divides(scales.groups, x.groups) && divides(scales.rows, x.rows) &&
          divides(scales.cols, x.cols),
      where, "scale shape",
      fmt::format("extents dividing the shape of x [{}, {}, {}]", x.groups, x.rows, x.cols),
      fmt::format("[{}, {}, {}]{}", scales.groups, scales.rows, scales.cols,
                  scales.data ? "" : " with no data"));
  const std::int64_t count = scales.groups * scales.rows * scales.cols;
  detail::check_scale_values(where, scales.data, count);
  detail::QuantizePlan plan;
  plan.block = {x.groups / scales.groups, x.rows / scales.rows, x.cols / scales.cols};
  plan.source = detail::QuantizePlan::ScaleSource::given;
  QArray q = detail::empty_qarray(x, qtype, plan.block);
  std::copy(scales.data, scales.data + count, q.scale.begin());
  detail::run_quantize(x, qtype, plan, q.scale.data(), q.qvalue.data(), resolve_threads(threads));
  return q;
}

inline QArray quantize_with_scales(const Matrix& x, QType qtype, const ScaleArray& scales,
                                   int threads = 1) {
  detail::require(scales.groups == 1, "gmm::quantize_with_scales", "scale groups",
                  "1 for a 2-D operand", scales.groups);
  return quantize_with_scales(detail::as_grouped(x), qtype, scales, threads);
}

// out = q * scale (fp32 product, rounded to bf16 for a bf16 output), for a quantized grouped
// operand (fp8 or int8 with its scales). Non-finite scales, which gmm::quantize produces for a
// block holding NaN or inf as Qwix does, dequantize to non-finite values as in Qwix (gmm::gmm and
// quantize_with_scales refuse them). Throws gmm::Error before writing on bad input: scales
// missing or with a block that does not divide the shape; shapes that differ.
inline void dequantize(const GroupedMatrix& q, const OutGroupedMatrix& out, int threads = 1) {
  constexpr const char* where = "gmm::dequantize";
  detail::require(is_quantized(q.dtype), where, "q dtype", "float8_e4m3fn, float8_e5m2 or int8",
                  q.dtype);
  detail::check_grouped(where, "q", q.data, q.groups, q.rows, q.cols, q.group_stride, q.row_stride);
  detail::require(q.scales.data != nullptr || q.groups * q.rows * q.cols == 0, where, "q scales",
                  "an fp32 scale array", "none");
  detail::check_block(where, "q", "groups", q.scales.block.groups, q.groups);
  detail::check_block(where, "q", "rows", q.scales.block.rows, q.rows);
  detail::check_block(where, "q", "cols", q.scales.block.cols, q.cols);
  detail::check_output_dtype(where, out.dtype);
  detail::check_grouped(where, "out", out.data, out.groups, out.rows, out.cols, out.group_stride,
                        out.row_stride);
  detail::require(out.groups == q.groups && out.rows == q.rows && out.cols == q.cols, where,
                  "out shape", fmt::format("[{}, {}, {}]", q.groups, q.rows, q.cols),
                  fmt::format("[{}, {}, {}]", out.groups, out.rows, out.cols));
  if (out.dtype == DType::f32) {
    detail::dequantize_validated<float>(q, out, resolve_threads(threads));
  } else {
    detail::dequantize_validated<bfloat16>(q, out, resolve_threads(threads));
  }
}

inline void dequantize(const Matrix& q, const OutMatrix& out, int threads = 1) {
  dequantize(detail::as_grouped(q), detail::as_grouped(out), threads);
}

// The fp32 values of a QArray, dense row-major [groups, rows, cols]. Throws gmm::Error when its
// buffers do not match its shape and block (qvalue size, scale count).
inline std::vector<float> dequantize(const QArray& q, int threads = 1) {
  constexpr const char* where = "gmm::dequantize";
  detail::require(q.groups >= 0 && q.rows >= 0 && q.cols >= 0, where, "shape",
                  "non-negative extents", fmt::format("[{}, {}, {}]", q.groups, q.rows, q.cols));
  const std::int64_t size = q.groups * q.rows * q.cols;
  detail::require(static_cast<std::int64_t>(q.qvalue.size()) == size, where, "qvalue size",
                  fmt::format("{} (shape [{}, {}, {}])", size, q.groups, q.rows, q.cols),
                  q.qvalue.size());
  detail::check_block(where, "q", "groups", q.block.groups, q.groups);
  detail::check_block(where, "q", "rows", q.block.rows, q.rows);
  detail::check_block(where, "q", "cols", q.block.cols, q.cols);
  const std::int64_t count = detail::scale_count(q.groups, q.rows, q.cols, q.block);
  detail::require(static_cast<std::int64_t>(q.scale.size()) == count, where, "scale size",
                  fmt::format("{} (one per {}x{}x{} block of [{}, {}, {}])", count, q.block.groups,
                              q.block.rows, q.block.cols, q.groups, q.rows, q.cols),
                  q.scale.size());
  std::vector<float> values(static_cast<std::size_t>(size));
  if (size == 0) return values;
  dequantize(q.grouped(),
             OutGroupedMatrix{values.data(), DType::f32, q.groups, q.rows, q.cols, q.rows * q.cols,
                              q.cols},
             threads);
  return values;
}

}  // namespace gmm
