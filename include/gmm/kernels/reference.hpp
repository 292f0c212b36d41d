// Portable path: the element-by-element packer every format can use and the scalar fp32 kernel.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gmm/core/dtype.hpp"
#include "gmm/core/qvalue.hpp"
#include "gmm/kernels/format.hpp"

namespace gmm::kernels {

// Exact value of element (lane, k) of a source as it enters the product: the stored value, or
// its quantized value (core/qvalue.hpp rules, without the scale) when quantizing in the kernel.
inline float source_value(const PanelSource& s, std::int64_t lane, std::int64_t k,
                          float lane_scale) {
  const float x = load_as_float(s.data, s.dtype, lane * s.lane_stride + k * s.k_stride);
  if (!s.quantize) return x;
  return detail::dequantize_value(detail::quantize_value(x, lane_scale, s.qtype), s.qtype);
}

// bf16 bits of a value exactly representable in bf16 (NaN stays NaN).
inline std::uint16_t bf16_bits(float x) {
  return Eigen::numext::bit_cast<std::uint16_t>(bfloat16(x));
}

// Where element (step, lane, d) of a packed panel lives: lane-major for A, step-major for B.
enum class PanelOrder : std::uint8_t { lane_major, step_major };

template <PanelOrder kOrder>
inline std::int64_t panel_index(std::int64_t step, std::int64_t lane, int d, std::int64_t steps,
                                int width, int depth) {
  return kOrder == PanelOrder::lane_major ? (lane * steps + step) * depth + d
                                          : (step * width + lane) * depth + d;
}

// Stores an exact value as a packed element (bf16 elements: values exact in bf16).
template <PackedElement kElement>
inline void store_packed(void* out, std::int64_t index, float value) {
  if constexpr (kElement == PackedElement::f32) {
    static_cast<float*>(out)[index] = value;
  } else {
    static_cast<std::uint16_t*>(out)[index] = bf16_bits(value);
  }
}

// Packs panels element by element: any dtype, any strides, in-kernel quantization included.
template <PackedElement kElement, int kDepth, PanelOrder kOrder, int kStepMultiple = 1>
void pack_reference(const PanelSource& source, int width, std::int64_t lane0, std::int64_t lanes,
                    std::int64_t k0, std::int64_t kc, const float* lane_scales, void* out) {
  const std::int64_t steps =
      ((kc + kDepth - 1) / kDepth + kStepMultiple - 1) / kStepMultiple * kStepMultiple;
  const std::int64_t panel_bytes =
      steps * width * kDepth * (kElement == PackedElement::f32 ? 4 : 2);
  for (std::int64_t p = 0; p * width < lanes; ++p) {
    void* panel = static_cast<unsigned char*>(out) + p * panel_bytes;
    for (std::int64_t s = 0; s < steps; ++s) {
      for (int w = 0; w < width; ++w) {
        const std::int64_t lane = p * width + w;
        for (int d = 0; d < kDepth; ++d) {
          const std::int64_t k = s * kDepth + d;
          const float value = (lane < lanes && k < kc)
                                  ? source_value(source, lane0 + lane, k0 + k, lane_scales[lane])
                                  : 0.0f;
          store_packed<kElement>(panel, panel_index<kOrder>(s, w, d, steps, width, kDepth), value);
        }
      }
    }
  }
}

// Absmax of lanes over a contraction range, element by element.
inline void absmax_reference(const PanelSource& source, std::int64_t lane0, std::int64_t lanes,
                             std::int64_t k_begin, std::int64_t k_end, float* absmax) {
  for (std::int64_t w = 0; w < lanes; ++w) absmax[w] = 0.0f;
  for (std::int64_t k = k_begin; k < k_end; ++k) {
    for (std::int64_t w = 0; w < lanes; ++w) {
      absmax[w] = detail::absmax_update(
          absmax[w], load_as_float(source.data, source.dtype,
                                   (lane0 + w) * source.lane_stride + k * source.k_stride));
    }
  }
}

// Applies the micro-kernel epilogue to one accumulator element.
inline void store_tile_element(float* c, float acc, float row_scale, float col_scale, bool first) {
  const float scaled = acc * row_scale * col_scale;
  *c = first ? scaled : *c + scaled;
}

// Scalar fp32 micro-kernel: kMr x kNr accumulators, one contraction index per step.
template <int kMr, int kNr>
void kernel_scalar_f32(std::int64_t steps, const void* a_packed, const void* b_packed, float* c,
                       std::int64_t ldc, const float* row_scales, const float* col_scales,
                       bool first, int rows) {
  const float* a = static_cast<const float*>(a_packed);
  const float* b = static_cast<const float*>(b_packed);
  float acc[kMr][kNr] = {};
  for (std::int64_t s = 0; s < steps; ++s, b += kNr) {
    for (int i = 0; i < kMr; ++i) {
      for (int j = 0; j < kNr; ++j) acc[i][j] += a[i * steps + s] * b[j];
    }
  }
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < kNr; ++j) {
      store_tile_element(c + i * ldc + j, acc[i][j], row_scales[i], col_scales[j], first);
    }
  }
}

// KernelKit::stream of the fp32 kits: each element of C summed over each chunk's contraction in
// order, one index at a time, as the scalar micro-kernel does (B widened exactly by
// load_as_float), then stored chunk after chunk by the micro-kernel's epilogue.
inline void stream_reference(const PanelSource& b, std::int64_t n0, std::int64_t n1,
                             const StreamChunk* chunks, std::int64_t count, int rows, float* c,
                             std::int64_t ldc, bool first) {
  const std::int64_t cols = n1 - n0;
  std::vector<float> acc(static_cast<std::size_t>(rows * cols));
  for (std::int64_t s = 0; s < count; ++s) {
    const StreamChunk& chunk = chunks[s];
    const float* a = static_cast<const float*>(chunk.a);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (std::int64_t k = 0; k < chunk.kc; ++k) {
      for (std::int64_t j = 0; j < cols; ++j) {
        const float value =
            load_as_float(b.data, b.dtype, (n0 + j) * b.lane_stride + (chunk.k0 + k) * b.k_stride);
        for (int i = 0; i < rows; ++i) acc[i * cols + j] += a[i * chunk.a_stride + k] * value;
      }
    }
    for (int i = 0; i < rows; ++i) {
      for (std::int64_t j = 0; j < cols; ++j) {
        store_tile_element(c + i * ldc + j, acc[i * cols + j], chunk.row_scales[i],
                           chunk.col_scales[j], first && s == 0);
      }
    }
  }
}

// The portable path: fp32 values (bf16 / fp8 / int8 widened exactly) and the scalar kernel.
inline KernelKit scalar_kit() {
  KernelKit kit;
  kit.isa = Isa::scalar;
  kit.format = {PackedElement::f32, 4, 16, 1};
  kit.pack_a = pack_reference<PackedElement::f32, 1, PanelOrder::lane_major>;
  kit.pack_b = pack_reference<PackedElement::f32, 1, PanelOrder::step_major>;
  kit.kernel = kernel_scalar_f32<4, 16>;
  kit.stream = stream_reference;
  kit.stream_rows = four_stream_rows;
  kit.absmax = absmax_reference;
  kit.tiles = {64, 256, 256};
  return kit;
}

}  // namespace gmm::kernels
