// Packed operand formats and the type-erased packer / micro-kernel interface of every ISA path.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gmm/core/dtype.hpp"
#include "gmm/core/options.hpp"

namespace gmm::kernels {

// Element type of packed panels: fp32 for FMA kernels, bf16 pairs for the bf16 dot product.
enum class PackedElement : std::uint8_t { f32, bf16 };

// The packed layout a micro-kernel reads (gemmlowp style: the kernel declares it and packers
// adapt to it). A panel of `width` lanes (mr rows of A, or nr columns of B) over kc contraction
// steps is stored as ceil(kc / depth) consecutive blocks of [width][depth] elements; lanes past
// the operand's edge and steps past kc are zero.
struct PackedFormat {
  PackedElement element = PackedElement::f32;
  int mr = 1;     // rows of C per micro-tile (lanes of an A panel)
  int nr = 1;     // columns of C per micro-tile (lanes of a B panel)
  int depth = 1;  // contraction steps per lane and block: 2 for bf16 pairs, 1 for fp32

  std::size_t element_bytes() const { return element == PackedElement::f32 ? 4 : 2; }
  std::int64_t steps(std::int64_t kc) const { return (kc + depth - 1) / depth; }
  // Bytes of one packed panel of `width` lanes over kc contraction steps.
  std::size_t panel_bytes(int width, std::int64_t kc) const {
    return static_cast<std::size_t>(steps(kc) * width * depth) * element_bytes();
  }
};

// One operand of C = A * B seen as lanes x contraction: element (lane, k) is stored at
// data + lane * lane_stride + k * k_stride (in elements of dtype). A's lanes are the rows of C,
// B's lanes its columns. When `quantize` is set the (f32 / bf16) values are quantized to qtype
// while packing, with one scale per lane given to the packer (core/qvalue.hpp rules).
struct PanelSource {
  const void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t lane_stride = 0;
  std::int64_t k_stride = 0;
  bool quantize = false;
  QType qtype = QType::float8_e4m3fn;
};

// Packs lanes [lane0, lane0 + lanes) (lanes <= width) and steps [k0, k0 + kc) of `source` into
// one panel of the kit's format; lane_scales[w] is lane w's quantization scale.
using PackFn = void (*)(const PanelSource& source, int width, std::int64_t lane0,
                        std::int64_t lanes, std::int64_t k0, std::int64_t kc,
                        const float* lane_scales, void* out);

// Computes one mr x nr micro-tile over `steps` packed blocks and applies the epilogue
// c[i * ldc + j] (= when first, else +=) acc[i][j] * row_scales[i] * col_scales[j].
using MicroKernelFn = void (*)(std::int64_t steps, const void* a, const void* b, float* c,
                               std::int64_t ldc, const float* row_scales, const float* col_scales,
                               bool first);

// Everything a driver needs from one ISA path for one kind of data: the format, its packer and
// its micro-kernel, and the default cache blocking (rows, contraction, columns per task).
struct KernelKit {
  Isa isa = Isa::scalar;
  PackedFormat format;
  PackFn pack = nullptr;
  MicroKernelFn kernel = nullptr;
  Tiles tiles;
};

}  // namespace gmm::kernels
