// Packed operand formats and the type-erased packer / micro-kernel interface of every ISA path.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gmm/core/dtype.hpp"
#include "gmm/core/options.hpp"

namespace gmm::kernels {

// Element type of packed panels: fp32 for FMA kernels, bf16 pairs for the bf16 dot product.
enum class PackedElement : std::uint8_t { f32, bf16 };

// The packed layouts a micro-kernel reads (gemmlowp style: the kernel declares them and packers
// adapt to them). Over a chunk of kc contraction indices, cut into steps of `depth` indices (zero
// padded), an A panel of mr lanes (rows of C) is lane-major, [mr][steps][depth], so each row's
// contraction run is contiguous and the kernel broadcasts from it; a B panel of nr lanes (columns
// of C) is step-major, [steps][nr][depth], so each step is one contiguous vector load. Lanes past
// the operand's edge are zero.
struct PackedFormat {
  PackedElement element = PackedElement::f32;
  int mr = 1;             // rows of C per micro-tile (lanes of an A panel)
  int nr = 1;             // columns of C per micro-tile (lanes of a B panel)
  int depth = 1;          // contraction indices per step: 2 for bf16 pairs, 1 for fp32
  int step_multiple = 1;  // panels hold a multiple of this many steps (AMX: 16, one tile)

  std::size_t element_bytes() const { return element == PackedElement::f32 ? 4 : 2; }
  std::int64_t steps(std::int64_t kc) const {
    return ((kc + depth - 1) / depth + step_multiple - 1) / step_multiple * step_multiple;
  }
  // Bytes of one packed panel of `width` lanes over kc contraction indices.
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
  // Contraction indices the source holds (0: not given), so a packer may prefetch past its chunk
  // into the next one.
  std::int64_t depth = 0;
};

// Packs lanes [lane0, lane0 + lanes) and contraction indices [k0, k0 + kc) of `source` into
// ceil(lanes / width) consecutive A (width mr) or B (width nr) panels of the kit's format;
// lane_scales[w] is lane lane0 + w's quantization scale.
using PackFn = void (*)(const PanelSource& source, int width, std::int64_t lane0,
                        std::int64_t lanes, std::int64_t k0, std::int64_t kc,
                        const float* lane_scales, void* out);

// Computes one mr x nr micro-tile over `steps` packed steps and applies the epilogue
// c[i * ldc + j] (= when first, else +=) acc[i][j] * row_scales[i] * col_scales[j] to its first
// `rows` rows (the valid ones; the others are neither read nor written).
using MicroKernelFn = void (*)(std::int64_t steps, const void* a, const void* b, float* c,
                               std::int64_t ldc, const float* row_scales, const float* col_scales,
                               bool first, int rows);

// Computes `tiles` mr x nr micro-tiles of one A panel over `steps` packed steps, each as a
// MicroKernelFn with `first`, and writes their first `rows` rows straight into the output instead
// of a tile of C: tile t multiplies the B panel at b + t * b_panel_bytes and holds columns
// [t * nr, (t + 1) * nr), row i's acc[i][j] * row_scales[i] * col_scales[j] rounded to `dtype`
// (f32 or bf16) as StoreRowFn rounds it, at out + i * out_row_stride + j elements, with
// non-temporal stores (KernelKit::store_fence orders them). Each row's nr values of a tile are
// whole cache lines of the output, starting on a line. (The tiles of an A panel come in one call:
// a call per tile took a tenth of the decode drhs on Ice Lake.)
using OutputKernelFn = void (*)(std::int64_t steps, const void* a, const void* b,
                                std::size_t b_panel_bytes, std::int64_t tiles, void* out,
                                std::int64_t out_row_stride, DType dtype, const float* row_scales,
                                const float* col_scales, int rows);

// One contraction chunk of a streaming call: indices [k0, k0 + kc), all within one scale segment,
// A's packed panel for them (row i at a + i * a_stride elements; a lane-major A panel of the kit's
// format) and the chunk's scales (row_scales[i], col_scales[j - n0]).
struct StreamChunk {
  std::int64_t k0 = 0, kc = 0;
  const void* a = nullptr;
  std::int64_t a_stride = 0;
  const float* row_scales = nullptr;
  const float* col_scales = nullptr;
};

// Computes rows x [n0, n1) of C (rows <= KernelKit::stream_rows(b)) over the contraction chunks
// chunks[0 .. count) (count >= 1) straight from an unpacked B source (lanes = columns of C; not
// quantized in the kernel): B's values are widened on the fly. The epilogue is the micro-kernel's,
// summed over the chunks: c[i * ldc + j - n0] (= when first, else +=) the sum over chunks s of
// acc_s[i][j] * row_scales_s[i] * col_scales_s[j - n0]. Taking all of a task's chunks at once lets
// a kernel read each column's contraction run of B in one pass across its scale segments.
using StreamFn = void (*)(const PanelSource& b, std::int64_t n0, std::int64_t n1,
                          const StreamChunk* chunks, std::int64_t count, int rows, float* c,
                          std::int64_t ldc, bool first);

// KernelKit::stream_rows of the kits whose streaming kernels take up to 4 rows of any B.
inline int four_stream_rows(const PanelSource&) { return 4; }

// Writes absmax[w] = max |x| (NaN if any x is NaN, core/qvalue.hpp's absmax_update) over the
// contraction indices [k_begin, k_end) of lanes [lane0, lane0 + lanes) of an f32 / bf16 source.
using AbsmaxFn = void (*)(const PanelSource& source, std::int64_t lane0, std::int64_t lanes,
                          std::int64_t k_begin, std::int64_t k_end, float* absmax);

// Stores n fp32 values into an f32 or bf16 output row (bf16: rounded to nearest even, NaN kept
// with its sign as Eigen's bfloat16 conversion does), or adds them to it when `accumulate`.
// `bypass_cache` (not with `accumulate`): an output too large to be read back from cache, whose
// aligned vectors are stored non-temporally; KernelKit::store_fence orders those stores.
using StoreRowFn = void (*)(const float* src, void* dst, DType dtype, std::int64_t n,
                            bool accumulate, bool bypass_cache);

// Everything a driver needs from one ISA path for one kind of data: the format, its packers, its
// micro-kernel, the absmax scan of in-kernel quantization, and the default cache blocking (rows,
// contraction, columns per task).
struct KernelKit {
  Isa isa = Isa::scalar;
  PackedFormat format;
  PackFn pack_a = nullptr;
  PackFn pack_b = nullptr;
  MicroKernelFn kernel = nullptr;
  // Optional: the same contract for tiles whose valid rows are at most `few_rows` (it computes
  // only those rows), for groups of a few tokens (decode).
  MicroKernelFn few_rows_kernel = nullptr;
  int few_rows = 0;
  // Optional (with store_row and store_fence): the micro-kernel of a product of one contraction
  // chunk whose output bypasses the caches; it stores each tile as it finishes it, without the
  // pass that stores a tile of C and reads it back to round it (for tgmm's short groups, whose
  // products are short, that pass took almost as long as the products).
  OutputKernelFn output_kernel = nullptr;
  // Optional: the product of a few rows (at most `stream_rows(b)`, which depends on B's dtype and
  // layout) streamed from unpacked B, for tasks where packing B would cost as much as the
  // product (decode, groups of a dozen tokens).
  StreamFn stream = nullptr;
  int (*stream_rows)(const PanelSource& b) = nullptr;
  // Bytes of the buffer the streaming kernel may keep per thread (allocated on a thread's first
  // use, kept for its later calls); counted in the extra bytes of every call that streams.
  std::int64_t stream_scratch_bytes = 0;
  AbsmaxFn absmax = nullptr;
  StoreRowFn store_row = nullptr;  // optional: vectorized output epilogue
  // With store_row: makes the non-temporal stores of store_row(bypass_cache) visible before any
  // later store (run by each worker at the end of a task that bypassed the cache).
  void (*store_fence)() = nullptr;
  // Optional: run by each worker before and after a run of micro-kernel calls (AMX: load and
  // release the tile configuration).
  void (*begin)() = nullptr;
  void (*end)() = nullptr;
  Tiles tiles;
  // Optional (m = 0: tiles): tgmm's blocking when its rhs is quantized in the kernel (columns
  // narrowed for short groups; see v2::detail::tgmm_tiles). Each tgmm task quantizes its group's
  // rhs again; next to a micro-kernel as fast as AMX's, that took a third of the call unless the
  // tasks took more lanes.
  Tiles quantized_rhs_tiles;
  // Optional (0: tiles.k): the contraction chunk of a B with contiguous contraction runs (dlhs's
  // transposed weights), whose packer transposes tiles read from 16 lanes' runs: a longer chunk
  // reads longer runs of each lane; the block of columns shrinks in proportion (same bytes), but
  // not below the task's rows (see v2::detail::run_task).
  std::int64_t runs_chunk = 0;
};

}  // namespace gmm::kernels
