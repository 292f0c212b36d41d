// The blocked product shared by v2 gmm and tgmm: tasks over (group, row block, column block),
// contraction chunks inside scale segments, packing into the kernel's format, fp32 epilogue.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "gmm/core/dtype.hpp"
#include "gmm/core/parallel.hpp"
#include "gmm/core/qvalue.hpp"
#include "gmm/kernels/cpu.hpp"
#include "gmm/kernels/format.hpp"

namespace gmm::v2::detail {

// Where one operand's fp32 scales come from, per lane and contraction index: none (1), a stored
// array (pre-quantized operand), computed in the kernel (absmax per lane and contraction block)
// or one static value (fixed calibration).
struct SideScales {
  enum class Kind : std::uint8_t { none, stored, absmax, fixed };
  Kind kind = Kind::none;
  // stored: scale(lane, k) = data[(lane / lane_block) * lane_step + (k / k_block) * k_step].
  const float* data = nullptr;
  std::int64_t lane_block = 1, lane_step = 0, k_block = 1, k_step = 0;
  float fixed = 1.0f;            // fixed
  std::int64_t quant_block = 1;  // absmax: block along the contraction axis
  std::int64_t k_extent = 0;     // absmax: extent of the contraction axis
};

// One operand of C = A * B in global (lane, contraction) coordinates, with its scales.
struct Side {
  kernels::PanelSource source;
  SideScales scales;
};

// Absmax scales of one side's lanes over the contraction blocks its jobs touch, computed once
// before the tasks run and shared by the jobs that read the same lanes of the same source (tgmm's
// groups share their quantization blocks along M):
// scale(lane, block) = values[(lane - lane_begin) * blocks + block - block0].
struct AbsmaxTable {
  std::vector<float> values;
  std::int64_t lane_begin = 0, block0 = 0, blocks = 0;
};

// One group's product: C lanes [a_begin, a_end) x [0, n) over contraction [k_begin, k_end);
// element (i, j) of C is stored at out + (i * row_stride + j) elements.
struct Job {
  Side a, b;
  std::int64_t a_begin = 0, a_end = 0, k_begin = 0, k_end = 0;
  void* out = nullptr;
  std::int64_t a_table = -1, b_table = -1;  // index in Product::tables of an absmax side
};

// The whole call: its jobs and everything they share.
struct Product {
  kernels::KernelKit kit;
  Tiles tiles;                   // rows, contraction and columns per task
  std::int64_t runs_chunk = 0;   // KernelKit::runs_chunk, 0 when the call requested tiles
  bool tiles_requested = false;  // Options::tiles set: blocks of tiles.n kept (takes_all_columns)
  std::int64_t n = 0;            // columns of C
  std::int64_t segment = 1;      // scales are constant within aligned contraction segments
  DType out_dtype = DType::f32;
  std::int64_t out_row_stride = 0;
  bool accumulate = false;
  bool bypass_cache = false;   // the output streams past the caches (see run_product)
  bool rows_on_lines = false;  // every output row starts on a cache line
  bool rows_joined = false;    // streamed rows are contiguous, off their lines (write_whole_rows)
  std::vector<Job> jobs;
  std::vector<AbsmaxTable> tables;
  std::int64_t streamed_tasks = 0;  // tasks run_product gave to run_stream_task
};

// Allocates on 64-byte cache lines: the micro-kernels read the packed panels and update the
// tile of C a 64-byte vector at a time, and on Intel cores a vector that straddles two lines
// costs two accesses. malloc's 16-byte alignment made the compute-bound fp32 forward 1.5x slower
// on Ice Lake (2 threads: 185 to 189 ms against 123 to 126 ms aligned), and only in some calls
// (glibc serves large blocks at varying offsets).
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}  // NOLINT: rebinding is implicit
  T* allocate(std::size_t n) {
    return static_cast<T*>(
        ::operator new (n * sizeof(T), std::align_val_t{kernels::kCacheLineBytes}));
  }
  // Default-initializes (resize leaves new elements unset): every buffer is written before it is
  // read, and value-initializing zeroed a task's 3 MiB of panels and C on every call (a 512-row
  // fp8 forward on 1 thread spent 3% of its samples in memset).
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible<U>::value) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  void deallocate(T* p, std::size_t) {
    ::operator delete (p, std::align_val_t{kernels::kCacheLineBytes});
  }
  bool operator==(const CacheLineAllocator&) const { return true; }
  bool operator!=(const CacheLineAllocator&) const { return false; }
};

template <typename T>
using LineAlignedVector = std::vector<T, CacheLineAllocator<T>>;

// Per-thread buffers: packed panels, the fp32 tile of C and per-lane scales.
struct Workspace {
  LineAlignedVector<unsigned char> a_packed, b_packed;
  LineAlignedVector<float> c, a_scales, b_scales;
  std::vector<std::int64_t> chunks;            // contraction chunk starts, then the end
  std::vector<kernels::StreamChunk> streamed;  // the chunks of a streamed task

  std::int64_t bytes() const {
    return static_cast<std::int64_t>(
        a_packed.capacity() + b_packed.capacity() +
        sizeof(float) * (c.capacity() + a_scales.capacity() + b_scales.capacity()) +
        sizeof(std::int64_t) * chunks.capacity() +
        sizeof(kernels::StreamChunk) * streamed.capacity());
  }
};

// One unit of parallel work: C rows [a0, a1) and columns [n0, n1) of one job, whole contraction;
// `stream`: run on the kit's streaming kernel (streams()), else on the packed path.
struct Task {
  std::int64_t job = 0, a0 = 0, a1 = 0, n0 = 0, n1 = 0;
  bool stream = false;
};

// True when an operand enters the product exactly representable in bf16.
inline bool exact_in_bf16(DType dtype, bool quantized_in_kernel) {
  return quantized_in_kernel || dtype != DType::f32;
}

inline std::int64_t round_up(std::int64_t x, std::int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

// Fills the absmax scales of lanes [lane0, lane0 + lanes) of one side in contraction block b
// into its table (core/qvalue.hpp rules).
inline void fill_absmax_table(const kernels::KernelKit& kit, const Side& side, AbsmaxTable& table,
                              std::int64_t b, std::int64_t lane0, std::int64_t lanes,
                              std::vector<float>& scratch) {
  const std::int64_t size = side.scales.quant_block;
  scratch.resize(static_cast<std::size_t>(lanes));
  kit.absmax(side.source, lane0, lanes, b * size, std::min(side.scales.k_extent, (b + 1) * size),
             scratch.data());
  for (std::int64_t w = 0; w < lanes; ++w) {
    table.values[(lane0 - table.lane_begin + w) * table.blocks + (b - table.block0)] =
        gmm::detail::absmax_scale(scratch[w], side.source.qtype);
  }
}

// Scales of one side for lanes [lane0, lane0 + lanes) in the contraction chunk starting at k
// (padded lanes up to `padded` get 0).
inline void chunk_scales(const Side& side, const AbsmaxTable* table, std::int64_t lane0,
                         std::int64_t lanes, std::int64_t padded, std::int64_t k, float* out) {
  const SideScales& s = side.scales;
  switch (s.kind) {
    case SideScales::Kind::none:
      std::fill(out, out + lanes, 1.0f);
      break;
    case SideScales::Kind::fixed:
      std::fill(out, out + lanes, s.fixed);
      break;
    case SideScales::Kind::stored: {  // one lookup per run of lanes sharing a scale block
      const float* row = s.data + (k / s.k_block) * s.k_step;
      if (s.lane_block == 1) {  // per channel
        for (std::int64_t w = 0; w < lanes; ++w) out[w] = row[(lane0 + w) * s.lane_step];
        break;
      }
      for (std::int64_t w = 0; w < lanes;) {
        const std::int64_t block = (lane0 + w) / s.lane_block;
        const std::int64_t run = std::min(lanes, (block + 1) * s.lane_block - lane0) - w;
        std::fill(out + w, out + w + run, row[block * s.lane_step]);
        w += run;
      }
      break;
    }
    case SideScales::Kind::absmax: {
      const float* column = table->values.data() + (lane0 - table->lane_begin) * table->blocks +
                            (k / s.quant_block - table->block0);
      for (std::int64_t w = 0; w < lanes; ++w) out[w] = column[w * table->blocks];
      break;
    }
  }
  std::fill(out + lanes, out + padded, 0.0f);
}

// The absmax table at `index` in p.tables, or null for a side without one.
inline const AbsmaxTable* table(const Product& p, std::int64_t index) {
  return index < 0 ? nullptr : &p.tables[static_cast<std::size_t>(index)];
}

// Stores whole rows [a0, a1) of C (row a0 first; with ldc 0, the same row of `c` into each) into
// an output past the caches whose rows follow each other off their cache lines
// (Product::rows_joined), in whole lines: a line that holds the end of one row and the start of
// the next is assembled from both and streamed as one; only the first row's start and the last
// row's end, which share lines with other rows' writers, are stored as usual. Each row stored on
// its own left two partial lines per row: the skewed fp8 drhs (K = 2048, N = 1408 bf16, 64 groups)
// into an output 16 bytes off a line took 60-70 ms against 21-22 ms on lines.
inline void write_whole_rows(const Product& p, const Job& job, std::int64_t a0, std::int64_t a1,
                             const float* c, std::int64_t ldc) {
  const std::int64_t element = static_cast<std::int64_t>(size_of(p.out_dtype));
  const std::int64_t line_values = kernels::kCacheLineBytes / element;
  auto* out = static_cast<unsigned char*>(job.out);
  float joint[kernels::kCacheLineBytes / 2];  // a line of the narrowest output (bf16)
  for (std::int64_t i = a0; i < a1; ++i) {
    const float* src = c + (i - a0) * ldc;
    unsigned char* row = out + i * p.n * element;
    const std::int64_t head = kernels::values_before_line(row, element, p.n);
    const std::int64_t lines_end = head + (p.n - head) / line_values * line_values;
    if (i == a0) p.kit.store_row(src, row, p.out_dtype, head, false, false);
    p.kit.store_row(src + head, row + head * element, p.out_dtype, lines_end - head, false, true);
    const std::int64_t tail = p.n - lines_end;
    if (i + 1 == a1) {
      p.kit.store_row(src + lines_end, row + lines_end * element, p.out_dtype, tail, false, false);
    } else if (tail > 0) {  // the next row's head completes the line
      const float* next = c + (i + 1 - a0) * ldc;
      std::copy(src + lines_end, src + p.n, joint);
      std::copy(next, next + (line_values - tail), joint + tail);
      p.kit.store_row(joint, row + lines_end * element, p.out_dtype, line_values, false, true);
    }
  }
}

// Stores rows [a0, a1) x columns [b0, b0 + cols) of C from their fp32 tile `c` (row a0 first;
// with ldc 0, the same row of `c` into each) into the output (once rounded for bf16; added when
// accumulating).
inline void write_rows(const Product& p, const Job& job, std::int64_t a0, std::int64_t a1,
                       std::int64_t b0, std::int64_t cols, const float* c, std::int64_t ldc) {
  const std::int64_t element = static_cast<std::int64_t>(size_of(p.out_dtype));
  if (p.rows_joined && b0 == 0 && cols == p.n) {
    write_whole_rows(p, job, a0, a1, c, ldc);
    return;
  }
  // a part of joined rows goes through the caches: its ends would be partial lines (the fp8
  // forward, N = 14336 bf16 in blocks of 512 columns, 16 bytes off the lines: 43 ms through the
  // caches, 83 past them)
  const bool bypass = p.bypass_cache && p.rows_on_lines;
  for (std::int64_t i = a0; i < a1; ++i) {
    const float* src = c + (i - a0) * ldc;
    const std::int64_t offset = i * p.out_row_stride + b0;
    if (p.kit.store_row != nullptr) {
      p.kit.store_row(src, static_cast<unsigned char*>(job.out) + offset * element, p.out_dtype,
                      cols, p.accumulate, bypass);
      continue;
    }
    if (p.out_dtype == DType::f32) {
      float* dst = static_cast<float*>(job.out) + offset;
      if (p.accumulate) {
        for (std::int64_t j = 0; j < cols; ++j) dst[j] += src[j];
      } else {
        std::memcpy(dst, src, sizeof(float) * static_cast<std::size_t>(cols));
      }
    } else {
      bfloat16* dst = static_cast<bfloat16*>(job.out) + offset;
      for (std::int64_t j = 0; j < cols; ++j) {
        dst[j] = bfloat16(p.accumulate ? static_cast<float>(dst[j]) + src[j] : src[j]);
      }
    }
  }
}

// Largest A block a task packs once over the whole contraction (see run_task): 32 MiB per worker
// covers tiles.m rows of an fp32 contraction of 20k (Mixtral's dlhs contracts over 14336). A
// larger block is packed (and quantized) again for every block of columns, which costs more than
// reading the packed block back from memory, panel by panel, prefetched.
constexpr std::int64_t kWholeABytes = 32 * 1024 * 1024;

// Bytes of the packed B block of a task that takes many columns at once: one that takes all its
// columns (takes_all_columns), or one whose contraction is a single chunk (see run_task).
constexpr std::int64_t kWideBlockBytes = 512 * 1024;

// Bytes of C a task holds across its contraction chunks, at most (see run_task): three quarters
// of a 2 MiB L2, with room for a B block (the forward's 512 x 512 tiles, 1 MiB, stay whole). A
// task with more takes its A panels in passes that hold kPassOfCBytes each
// (run_block_panels_over_chunks).
constexpr std::int64_t kTaskOfCBytes = 1536 * 1024;
constexpr std::int64_t kPassOfCBytes = 512 * 1024;

// Bytes of C one A panel holds across a block of a one-chunk task (see run_task): half of a
// 32 KiB L1, so the panel's rows are still there when they are stored. (A whole 4096-column row
// of bf16 decode drhs kept there in L2 took 1.4x as long.)
constexpr std::int64_t kPanelOfCBytes = 16 * 1024;

// Columns of each streamed task (the tasks of a few rows split the columns among the workers):
// with contiguous columns, 4 KiB of each contraction row (a page: the hardware prefetchers fetch
// whole pages of a partly read row, and the memory serves whole rows best); with contiguous
// contraction runs, 512 columns.
inline std::int64_t stream_columns(const kernels::PanelSource& b) {
  if (b.k_stride == 1) return 512;
  return std::max<std::int64_t>(64, 4096 / static_cast<std::int64_t>(size_of(b.dtype)));
}

// True when a task of `rows` rows of `job` runs on the kit's streaming kernel: a few rows and a B
// that is not quantized in the kernel (that case keeps the packed path, which quantizes once).
inline bool streams(const Product& p, const Job& job, std::int64_t rows) {
  return p.kit.stream != nullptr && rows <= p.kit.stream_rows(job.b.source) &&
         !job.b.source.quantize;
}

// Columns of each block of a task of `rows` rows that takes its columns together
// (takes_all_columns): all of them, unless its C across them (fp32, rows padded to the panel,
// held over the chunks) would be larger than kWideBlockBytes, which only a task of a few rows
// allows; then as many as keep it within (4096 on the AMX kit, with chunks of 64). With all of
// Mixtral's 14336 columns, a group of 5 to 16 rows on the AMX kit held 1.8 MiB of C over chunks of
// 32, which went to memory and back for every chunk (scratch, fp8 forward, K = 4096, 2 threads,
// ms): 8 groups of 8 rows 195-200 -> 36.3-37.6; DeepSeek-V3's down projection (N = 7168, 32
// groups of about 16 rows) 25.1-25.8 -> 20.0-21.0; N = 2880 and N = 4096 (all columns) level.
inline std::int64_t wide_block_columns(const Product& p, std::int64_t rows) {
  const kernels::PackedFormat& f = p.kit.format;
  const std::int64_t fitting =
      kWideBlockBytes / (round_up(rows, f.mr) * static_cast<std::int64_t>(sizeof(float)));
  return std::min(round_up(p.n, f.nr), std::max<std::int64_t>(f.nr, fitting / f.nr * f.nr));
}

// The contraction chunk of a task of `rows` rows that takes its columns together
// (takes_all_columns): no longer than keeps the B block of wide_block_columns within
// kWideBlockBytes (in L2), nor than tiles.k.
inline std::int64_t all_columns_chunk(const Product& p, std::int64_t rows) {
  const kernels::PackedFormat& f = p.kit.format;
  const std::int64_t quantum = f.depth * f.step_multiple;  // contraction per packed step group
  const std::int64_t block_kc = kWideBlockBytes / (wide_block_columns(p, rows) *
                                                   static_cast<std::int64_t>(f.element_bytes()));
  return std::max(quantum, std::min(p.tiles.k, block_kc) / quantum * quantum);
}

// True when a packed task of `rows` rows of `job` takes all its columns at once (run_task), which
// reads B's rows whole and in order (or, for a few rows of a wide B, in blocks of
// wide_block_columns). Only B with contiguous lanes ([K, N] weights): with contiguous
// contraction runs (transposed weights), the chunk that keeps the B block in L2 held a few bytes
// of each run (dsv3-up's dlhs on the AMX kit: 32 of 1024, half a line each time, and that packer
// took 48% of the samples). Then a task of a few rows does; so does one of more rows when its C
// across all the columns (fp32, held over the chunks) is no larger than the B block, so that both
// stay in L2, and the chunk is at least half of tiles.k, so that C is not read and written again
// every few steps. Blocks of tiles.n columns read a part of each weight row at a time, which the
// memory serves slower (2 threads on the AMX kit, blocks against all columns, ms: the
// skewed-uniform forward, groups of 23 to 45 rows and N = 1408, fp8 22.7-23.4 against 19.4-20.3,
// bf16 30.8 against 24.8-25.0; fp32 on the AVX-512 kit 73.9-75.5 against 69.8-71.1).
// DeepSeek-V3's down projection (groups of 17 to 29 rows, N = 7168) stays in blocks: with all its
// columns, C is 0.5 to 0.9 MiB and its fp8 forward took 24.0-26.5 ms against 23.0-23.1 in blocks
// (scratch). A call that requested tiles keeps its blocks for all but a few rows.
inline bool takes_all_columns(const Product& p, const Job& job, std::int64_t rows) {
  if (job.b.source.k_stride == 1) return false;
  if (rows <= p.kit.few_rows) return true;
  if (p.tiles_requested) return false;
  const kernels::PackedFormat& f = p.kit.format;
  const std::int64_t c_bytes =
      round_up(rows, f.mr) * round_up(p.n, f.nr) * static_cast<std::int64_t>(sizeof(float));
  return c_bytes <= kWideBlockBytes && 2 * all_columns_chunk(p, rows) >= p.tiles.k;
}

// The longest contraction chunk of a packed task of `rows` rows: tiles.k, or all_columns_chunk
// for a task that takes all its columns.
inline std::int64_t packed_chunk(const Product& p, bool all_columns, std::int64_t rows) {
  return all_columns ? all_columns_chunk(p, rows) : std::max<std::int64_t>(1, p.tiles.k);
}

// Fills ws.chunks with the starts of a job's contraction chunks, then its end: at most max_kc
// long, never across a scale segment, except that a rest of the segment no longer than a quarter
// of max_kc joins the chunk before it. A short last chunk costs nearly a whole chunk's epilogue
// for little product, and a task of two chunks holds all its rows of C instead of one panel's
// (run_task): mixtral's fp8 drhs (groups of 240 and 272 rows, 2 threads on the AMX kit) took
// 63-69 ms against 54-55 ms with two groups of 256.
inline std::int64_t fill_chunks(const Product& p, const Job& job, std::int64_t max_kc,
                                Workspace& ws) {
  ws.chunks.clear();
  for (std::int64_t k = job.k_begin; k < job.k_end;) {
    ws.chunks.push_back(k);
    const std::int64_t segment_end = std::min(job.k_end, (k / p.segment + 1) * p.segment);
    const std::int64_t next = std::min(segment_end, k + max_kc);
    k = segment_end - next <= max_kc / 4 ? segment_end : next;
  }
  const std::int64_t count = static_cast<std::int64_t>(ws.chunks.size());
  ws.chunks.push_back(job.k_end);
  return count;
}

// Computes one task of a few rows on the kit's streaming kernel: the task's A rows are packed
// once over the whole contraction (one panel of exactly `rows` lanes per chunk, quantized in the
// kernel where asked) while the kernel reads B's columns [n0, n1) unpacked; finally the fp32 tile
// is stored. B with contiguous columns is chunked as the packed path chunks it (so the sums are
// bit-identical to it), one kernel call per chunk (each chunk's column scales written over the
// last's: a decode forward has dozens of chunks of thousands of columns); B with contiguous
// contraction runs only at scale segments, all in one call (the runs kernels read each column's
// run once across the segments).
inline void run_stream_task(const Product& p, const Task& t, Workspace& ws) {
  const Job& job = p.jobs[t.job];
  const kernels::PackedFormat& f = p.kit.format;
  const std::int64_t rows = t.a1 - t.a0, cols = t.n1 - t.n0;
  const bool runs = job.b.source.k_stride == 1;
  const std::int64_t chunk_count = fill_chunks(
      p, job,
      runs ? job.k_end - job.k_begin : packed_chunk(p, takes_all_columns(p, job, rows), rows), ws);
  const std::int64_t slots = runs ? chunk_count : 1;  // chunks per kernel call

  ws.a_scales.resize(static_cast<std::size_t>(chunk_count * rows));
  ws.b_scales.resize(static_cast<std::size_t>(slots * cols));
  std::size_t a_bytes = 0;
  for (std::int64_t c = 0; c < chunk_count; ++c) {
    a_bytes += f.panel_bytes(static_cast<int>(rows), ws.chunks[c + 1] - ws.chunks[c]);
  }
  ws.a_packed.resize(a_bytes);
  ws.c.assign(static_cast<std::size_t>(rows * cols), 0.0f);
  ws.streamed.resize(static_cast<std::size_t>(slots));
  std::size_t a_offset = 0;
  for (std::int64_t c = 0; c < chunk_count; ++c) {
    const std::int64_t slot = runs ? c : 0;
    kernels::StreamChunk& chunk = ws.streamed[slot];
    chunk.k0 = ws.chunks[c];
    chunk.kc = ws.chunks[c + 1] - chunk.k0;
    chunk.a = ws.a_packed.data() + a_offset;
    chunk.a_stride = f.steps(chunk.kc) * f.depth;
    float* a_scales = ws.a_scales.data() + c * rows;
    float* b_scales = ws.b_scales.data() + slot * cols;
    chunk_scales(job.a, table(p, job.a_table), t.a0, rows, rows, chunk.k0, a_scales);
    p.kit.pack_a(job.a.source, static_cast<int>(rows), t.a0, rows, chunk.k0, chunk.kc, a_scales,
                 ws.a_packed.data() + a_offset);
    chunk_scales(job.b, table(p, job.b_table), t.n0, cols, cols, chunk.k0, b_scales);
    chunk.row_scales = a_scales;
    chunk.col_scales = b_scales;
    a_offset += f.panel_bytes(static_cast<int>(rows), chunk.kc);
    if (!runs) {
      p.kit.stream(job.b.source, t.n0, t.n1, &chunk, 1, static_cast<int>(rows), ws.c.data(), cols,
                   c == 0);
    }
  }
  if (runs && chunk_count > 0) {
    p.kit.stream(job.b.source, t.n0, t.n1, ws.streamed.data(), chunk_count, static_cast<int>(rows),
                 ws.c.data(), cols, true);
  }
  write_rows(p, job, t.a0, t.a1, t.n0, cols, ws.c.data(), cols);
  if (p.bypass_cache) p.kit.store_fence();
}

// True when the output's rows start on cache lines and a tile's row of the output, nr values, is
// a whole number of lines: with blocks of columns that start at multiples of nr, every tile the
// output kernel writes is then whole lines.
inline bool output_kernel_fits(const Product& p) {
  return p.rows_on_lines && p.kit.format.nr * static_cast<std::int64_t>(size_of(p.out_dtype)) %
                                    kernels::kCacheLineBytes ==
                                0;
}

// Lines of a packed panel of `bytes`.
inline std::int64_t panel_lines(std::size_t bytes) {
  return round_up(static_cast<std::int64_t>(bytes), kernels::kCacheLineBytes) /
         kernels::kCacheLineBytes;
}

// Prefetches into L2 the share of the first `lines` lines of `panel` that tiles [tile0, tile1)
// carry, `per_tile` lines each: run_task sends the next A panel a share with each tile.
inline void prefetch_panel_share(const unsigned char* panel, std::int64_t lines,
                                 std::int64_t per_tile, std::int64_t tile0, std::int64_t tile1) {
  const std::int64_t end = std::min(lines, tile1 * per_tile);
  for (std::int64_t line = tile0 * per_tile; line < end; ++line) {
    kernels::prefetch_line_l2(panel + line * kernels::kCacheLineBytes);
  }
}

// One block of columns of a packed task whose A is packed whole (every chunk, one after the other),
// its B blocks over all the chunks in `b_bytes`: B packed for every chunk, then each pass of
// `pass_rows` A rows across the chunks (the kernel's first chunk stores, the others add, in chunk
// order as the chunk-outer loop does) into C, stored when final. A pass is one panel when the B
// blocks fit in L2 together; otherwise it holds kPassOfCBytes of C in L2, and each chunk's B block
// comes from memory once per pass. With the chunks outermost, C held the task's rows (2048 x 256
// fp32 for tgmm: all of L2) and went to memory and back for every chunk. gmm_bench drhs, 2 threads,
// binaries alternated twice, ms: fp8-block mixtral 67.2-69.1 -> 49.1-50.3, gptoss 25.9-26.2 ->
// 22.2-23.0, skewed 27.2-27.5 -> 24.6-24.7, compute-bound 31.9-33.8 -> 29.5-29.9; fp8 compute-bound
// 27.8 -> 26.5-27.1; the other cells within the noise (0.92x to 1.05x, among them cells whose
// groups are one chunk). Passes of 512 KiB of C for tgmm's 2048-lane tasks (whose B blocks over all
// the chunks are 2 MiB): the fp8 drhs of the compute-bound shape at full size (M = K = N = 4096,
// scratch, 2 threads, medians of four runs) 95.6-99.6 -> 86.2-92.0 ms (passes of 256 KiB and 1 MiB
// within the noise of 512, of 128 KiB slower); gmm_bench's scaled shape (1024 rows, four chunks)
// 25.9 -> 23.7-24.1 ms in one run, within the noise in another. Tasks of 1 MiB of C (the forward's
// 512 x 512 tiles) took longer in passes: fp32 compute-bound fwd and dlhs 94-99 -> 106-107 ms.
inline void run_block_panels_over_chunks(const Product& p, const Job& job, const Task& t,
                                         Workspace& ws, std::int64_t chunk_count, std::int64_t b0,
                                         std::int64_t cols, std::int64_t ldc, std::size_t b_bytes,
                                         std::int64_t pass_rows) {
  const kernels::PackedFormat& f = p.kit.format;
  const std::int64_t rows = t.a1 - t.a0, rows_padded = round_up(rows, f.mr);
  ws.b_scales.resize(static_cast<std::size_t>(chunk_count * ldc));
  ws.b_packed.resize(b_bytes);
  std::size_t b_offset = 0;
  for (std::int64_t c = 0; c < chunk_count; ++c) {
    const std::int64_t k = ws.chunks[c], kc = ws.chunks[c + 1] - k;
    float* b_scales = ws.b_scales.data() + c * ldc;
    chunk_scales(job.b, table(p, job.b_table), b0, cols, ldc, k, b_scales);
    p.kit.pack_b(job.b.source, f.nr, b0, cols, k, kc, b_scales, ws.b_packed.data() + b_offset);
    b_offset += (ldc / f.nr) * f.panel_bytes(f.nr, kc);
  }
  const std::int64_t tiles = ldc / f.nr;
  for (std::int64_t ir0 = 0; ir0 < rows_padded; ir0 += pass_rows) {
    const std::int64_t ir_end = std::min(rows_padded, ir0 + pass_rows);
    std::size_t a_offset = 0;
    b_offset = 0;
    for (std::int64_t c = 0; c < chunk_count; ++c) {
      const std::int64_t kc = ws.chunks[c + 1] - ws.chunks[c], steps = f.steps(kc);
      const std::size_t a_panel = f.panel_bytes(f.mr, kc), b_panel = f.panel_bytes(f.nr, kc);
      for (std::int64_t ir = ir0; ir < ir_end; ir += f.mr) {
        const bool few = rows - ir <= p.kit.few_rows;
        const int valid_rows = static_cast<int>(std::min<std::int64_t>(f.mr, rows - ir));
        const unsigned char* a_rows = ws.a_packed.data() + a_offset + (ir / f.mr) * a_panel;
        // the same panel of the next rows, into L2 a share of its lines with each tile
        const std::int64_t next_lines = ir + f.mr < rows_padded ? panel_lines(a_panel) : 0;
        const std::int64_t lines_per_tile = (next_lines + tiles - 1) / tiles;
        for (std::int64_t tile = 0; tile < tiles; ++tile) {
          const std::int64_t jr = tile * f.nr;
          prefetch_panel_share(a_rows + a_panel, next_lines, lines_per_tile, tile, tile + 1);
          (few ? p.kit.few_rows_kernel : p.kit.kernel)(
              steps, a_rows, ws.b_packed.data() + b_offset + tile * b_panel,
              ws.c.data() + (ir - ir0) * ldc + jr, ldc, ws.a_scales.data() + c * rows_padded + ir,
              ws.b_scales.data() + c * ldc + jr, c == 0, valid_rows);
        }
      }
      a_offset += (rows_padded / f.mr) * a_panel;
      b_offset += tiles * b_panel;
    }
    for (std::int64_t ir = ir0; ir < ir_end; ir += f.mr) {
      const std::int64_t valid_rows = std::min<std::int64_t>(f.mr, rows - ir);
      write_rows(p, job, t.a0 + ir, t.a0 + ir + valid_rows, b0, cols,
                 ws.c.data() + (ir - ir0) * ldc, ldc);
    }
  }
}

// Computes one task whose B is packed: pack the task's A rows over the whole contraction once
// (quantizing in the kernel where asked), then per block of tiles.n columns and contraction
// chunk pack the B panels and run the micro-kernel across the B block for each A panel (the A
// panel stays in L1 while the B block, tiles.k x tiles.n, streams from L2); in the last chunk,
// each A panel's rows of C are stored as soon as the kernel has run across the block (or, with
// one chunk and an output past the caches, each tile by the kit's output kernel; with several
// chunks whose B blocks fit in L2 together, or whose C over the task's rows would not,
// run_block_panels_over_chunks).
inline void run_task(const Product& p, const Task& t, Workspace& ws) {
  const Job& job = p.jobs[t.job];
  const kernels::PackedFormat& f = p.kit.format;
  const std::int64_t rows = t.a1 - t.a0, rows_padded = round_up(rows, f.mr);
  // A task of a few rows (packed when the kit streams fewer or B is quantized here), or of rows
  // whose C is small, reads [K, N] weights once: it takes all its columns at once (whole rows of
  // the weights are read in order; a few rows of a wide B, blocks of wide_block_columns) with a
  // chunk short enough to keep the B block in L2 (takes_all_columns, packed_chunk).
  const bool skinny = takes_all_columns(p, job, rows);
  std::int64_t block_cols = skinny ? std::min(t.n1 - t.n0, wide_block_columns(p, rows)) : p.tiles.n;
  std::int64_t max_kc = packed_chunk(p, skinny, rows);
  // B with contiguous contraction runs: a longer chunk, up to the kit's (KernelKit::runs_chunk),
  // over proportionally fewer columns, but no fewer than the task's rows: the A block is read
  // again for every block of columns, and reading it more often than B cost more than the longer
  // runs saved (compute-bound fp32 dlhs, 512-row tasks, 2 threads on Ice Lake: 133-141 ms with
  // 128-column blocks, 126-127 with 512).
  if (!skinny && job.b.source.k_stride == 1 && p.runs_chunk > max_kc) {
    const std::int64_t quantum = f.depth * f.step_multiple;
    const std::int64_t narrowest = std::min(block_cols, round_up(rows, f.nr));
    const std::int64_t cols = std::max(
        narrowest, round_up(std::max<std::int64_t>(1, block_cols * max_kc / p.runs_chunk), f.nr));
    max_kc =
        std::max(max_kc, std::min(p.runs_chunk, max_kc * block_cols / cols) / quantum * quantum);
    block_cols = cols;
  }
  const std::int64_t chunk_count = fill_chunks(p, job, max_kc, ws);
  if (chunk_count == 0) {
    // An empty contraction: zeros, stored a whole row of the task at a time (one row of zeros,
    // read again for every row). Blocks of 256 columns, 512-byte runs of 2048 rows each, went
    // to memory slower (Sapphire Rapids-class VM, 2 threads: the compute-bound fp8 drhs, whose
    // 268 MB gradient holds 235 MB of zeros, 32.2-32.5 -> 28.7-28.8 ms).
    ws.c.assign(static_cast<std::size_t>(t.n1 - t.n0), 0.0f);
    write_rows(p, job, t.a0, t.a1, t.n0, t.n1 - t.n0, ws.c.data(), 0);
    if (p.bypass_cache) p.kit.store_fence();
    return;
  }
  std::int64_t longest_chunk = 0;
  for (std::int64_t c = 0; c < chunk_count; ++c) {
    longest_chunk = std::max(longest_chunk, ws.chunks[c + 1] - ws.chunks[c]);
  }
  // One chunk (a short contraction, as tgmm's short groups): C holds one A panel at a time
  // (below), so a block takes as many columns as keep that panel's rows of C within
  // kPanelOfCBytes and its packed B within kWideBlockBytes.
  if (!skinny && chunk_count == 1) {
    const std::int64_t b_panel =
        static_cast<std::int64_t>(f.panel_bytes(f.nr, ws.chunks[1] - ws.chunks[0]));
    const std::int64_t c_cols =
        kPanelOfCBytes / (f.mr * static_cast<std::int64_t>(sizeof(float))) / f.nr * f.nr;
    block_cols = std::max(block_cols, std::min(kWideBlockBytes / b_panel * f.nr, c_cols));
    // Rows joined past the caches go out whole (write_whole_rows), so a task of whole rows takes
    // them in one block while the panel's rows of C stay within kWideBlockBytes (in L2).
    const bool whole_rows_fit =
        f.mr * round_up(p.n, f.nr) * static_cast<std::int64_t>(sizeof(float)) <= kWideBlockBytes;
    if (p.rows_joined && t.n0 == 0 && t.n1 == p.n && whole_rows_fit) {
      block_cols = p.n;
    }
  }

  // The A block over every chunk, with its per-row scales, packed once when it fits in
  // kWholeABytes (so quantizing it in the kernel happens once per row); otherwise each chunk's A
  // is packed again for every block of columns.
  ws.a_scales.resize(static_cast<std::size_t>(chunk_count * rows_padded));
  std::size_t a_bytes = 0, a_chunk_bytes = 0;
  for (std::int64_t c = 0; c < chunk_count; ++c) {
    const std::size_t bytes =
        (rows_padded / f.mr) * f.panel_bytes(f.mr, ws.chunks[c + 1] - ws.chunks[c]);
    a_bytes += bytes;
    a_chunk_bytes = std::max(a_chunk_bytes, bytes);
    chunk_scales(job.a, table(p, job.a_table), t.a0, rows, rows_padded, ws.chunks[c],
                 ws.a_scales.data() + c * rows_padded);
  }
  const bool whole_a = a_bytes <= static_cast<std::size_t>(kWholeABytes);
  ws.a_packed.resize(whole_a ? a_bytes : a_chunk_bytes);
  const auto pack_a_chunk = [&](std::int64_t c, std::size_t offset) {
    const std::int64_t k = ws.chunks[c], kc = ws.chunks[c + 1] - k;
    p.kit.pack_a(job.a.source, f.mr, t.a0, rows, k, kc, ws.a_scales.data() + c * rows_padded,
                 ws.a_packed.data() + offset);
  };
  std::size_t a_offset = 0;
  for (std::int64_t c = 0; whole_a && c < chunk_count; ++c) {
    pack_a_chunk(c, a_offset);
    a_offset += (rows_padded / f.mr) * f.panel_bytes(f.mr, ws.chunks[c + 1] - ws.chunks[c]);
  }

  // Several chunks whose B blocks fit in L2 together (short contractions cut at scale segments
  // or tiles.k, as tgmm's larger groups): B is packed for every chunk and each A panel runs
  // across all the chunks before the next, so C holds one panel and not the task's rows.
  std::size_t b_all_chunks_bytes = 0;
  for (std::int64_t c = 0; c < chunk_count; ++c) {
    b_all_chunks_bytes +=
        (round_up(block_cols, f.nr) / f.nr) * f.panel_bytes(f.nr, ws.chunks[c + 1] - ws.chunks[c]);
  }
  const bool panel_over_chunks =
      chunk_count > 1 && whole_a && b_all_chunks_bytes <= static_cast<std::size_t>(kWideBlockBytes);
  // Several chunks whose C over the task's rows would fill most of L2 (tgmm's long groups: 2048
  // lanes x 256 columns, 2 MiB): B is packed for every chunk, and passes of the A panels that hold
  // kPassOfCBytes of C run across all the chunks.
  const std::int64_t c_row_bytes =
      round_up(block_cols, f.nr) * static_cast<std::int64_t>(sizeof(float));
  const bool passes_over_chunks =
      !panel_over_chunks && chunk_count > 1 && whole_a && rows_padded * c_row_bytes > kTaskOfCBytes;
  const std::int64_t pass_rows =
      panel_over_chunks ? f.mr
                        : std::max<std::int64_t>(f.mr, kPassOfCBytes / c_row_bytes / f.mr * f.mr);
  // C holds the task's rows across the contraction chunks, or a pass's; with at most one chunk,
  // each A panel's rows are final once the kernel has run across the block, so C holds one panel.
  const std::int64_t c_rows = chunk_count <= 1 || panel_over_chunks ? f.mr
                              : passes_over_chunks                  ? pass_rows
                                                                    : rows_padded;
  const auto c_panel = [&](std::int64_t ir, std::int64_t ldc) {
    return ws.c.data() + (chunk_count <= 1 ? 0 : ir * ldc);
  };
  // A product of one chunk into an output past the caches stores its whole tiles from the
  // kit's output kernel (the tiles' rows are whole lines: see output_kernel_fits).
  const bool output_tiles =
      chunk_count == 1 && p.bypass_cache && p.kit.output_kernel != nullptr && output_kernel_fits(p);
  const std::int64_t element = static_cast<std::int64_t>(size_of(p.out_dtype));
  if (p.kit.begin != nullptr) p.kit.begin();
  for (std::int64_t b0 = t.n0; b0 < t.n1; b0 += block_cols) {
    const std::int64_t cols = std::min(block_cols, t.n1 - b0), ldc = round_up(cols, f.nr);
    ws.c.resize(static_cast<std::size_t>(c_rows * ldc));
    if (panel_over_chunks || passes_over_chunks) {
      run_block_panels_over_chunks(p, job, t, ws, chunk_count, b0, cols, ldc, b_all_chunks_bytes,
                                   pass_rows);
      continue;
    }
    ws.b_scales.resize(static_cast<std::size_t>(ldc));
    ws.b_packed.resize((ldc / f.nr) * f.panel_bytes(f.nr, longest_chunk));
    a_offset = 0;
    for (std::int64_t c = 0; c < chunk_count; ++c) {
      const std::int64_t k = ws.chunks[c], kc = ws.chunks[c + 1] - k;
      if (!whole_a) pack_a_chunk(c, a_offset);
      chunk_scales(job.b, table(p, job.b_table), b0, cols, ldc, k, ws.b_scales.data());
      p.kit.pack_b(job.b.source, f.nr, b0, cols, k, kc, ws.b_scales.data(), ws.b_packed.data());
      const std::int64_t steps = f.steps(kc);
      const std::size_t a_panel = f.panel_bytes(f.mr, kc), b_panel = f.panel_bytes(f.nr, kc);
      const float* a_scales = ws.a_scales.data() + c * rows_padded;
      const std::int64_t tiles = ldc / f.nr;
      const std::int64_t a_panel_lines = panel_lines(a_panel);
      // The next A panel, from memory, goes into L2 a share of its lines with each tile (all at
      // once, the prefetches stalled on the core's fill buffers: 4% of the compute-bound fp8
      // forward on Ice Lake, 1 thread). The share is divided out here, once per chunk: two 64-bit
      // divisions per tile were 1% of that forward on 2 threads.
      const std::int64_t lines_per_tile = (a_panel_lines + tiles - 1) / tiles;
      for (std::int64_t ir = 0; ir < rows_padded; ir += f.mr) {
        const unsigned char* a_rows = ws.a_packed.data() + a_offset + (ir / f.mr) * a_panel;
        const std::int64_t next_lines = whole_a && ir + f.mr < rows_padded ? a_panel_lines : 0;
        const auto prefetch_next_panel = [&](std::int64_t tile0, std::int64_t tile1) {
          prefetch_panel_share(a_rows + a_panel, next_lines, lines_per_tile, tile0, tile1);
        };
        float* c_rows_of_panel = c_panel(ir, ldc);
        const bool few = rows - ir <= p.kit.few_rows;
        const int valid_rows = static_cast<int>(std::min<std::int64_t>(f.mr, rows - ir));
        // whole tiles of a one-chunk product past the caches go straight to the output
        const std::int64_t out_tiles = output_tiles && !few ? cols / f.nr : 0;
        const std::int64_t out_cols = out_tiles * f.nr;
        if (out_tiles > 0) {
          prefetch_next_panel(0, out_tiles);
          p.kit.output_kernel(steps, a_rows, ws.b_packed.data(), b_panel, out_tiles,
                              static_cast<unsigned char*>(job.out) +
                                  ((t.a0 + ir) * p.out_row_stride + b0) * element,
                              p.out_row_stride, p.out_dtype, a_scales + ir, ws.b_scales.data(),
                              valid_rows);
        }
        for (std::int64_t tile = out_tiles; tile < tiles; ++tile) {
          const std::int64_t jr = tile * f.nr;
          prefetch_next_panel(tile, tile + 1);
          (few ? p.kit.few_rows_kernel : p.kit.kernel)(
              steps, a_rows, ws.b_packed.data() + tile * b_panel, c_rows_of_panel + jr, ldc,
              a_scales + ir, ws.b_scales.data() + jr, c == 0, valid_rows);
        }
        // the panel's rows are final: stored while they are in L1
        if (c + 1 == chunk_count && out_cols < cols) {
          write_rows(p, job, t.a0 + ir, t.a0 + ir + valid_rows, b0 + out_cols, cols - out_cols,
                     c_rows_of_panel + out_cols, ldc);
        }
      }
      if (whole_a) a_offset += (rows_padded / f.mr) * a_panel;
    }
  }
  if (p.kit.end != nullptr) p.kit.end();
  if (p.bypass_cache) p.kit.store_fence();
}

// The task blocking of a call: Options::tiles where set, else the kit's defaults, rounded up to
// whole micro-tiles and contraction steps.
inline Tiles resolve_tiles(const kernels::KernelKit& kit, const Tiles& requested) {
  const auto pick = [](std::int64_t asked, std::int64_t fallback, std::int64_t multiple) {
    return round_up(asked > 0 ? asked : fallback, multiple);
  };
  return {pick(requested.m, kit.tiles.m, kit.format.mr),
          pick(requested.k, kit.tiles.k, kit.format.depth),
          pick(requested.n, kit.tiles.n, kit.format.nr)};
}

// An empty product for `kit`: the call's blocking, its N, scale segment and output.
inline Product make_product(const kernels::KernelKit& kit, const Options& options, std::int64_t n,
                            std::int64_t segment, DType out_dtype, std::int64_t out_row_stride,
                            bool accumulate) {
  Product p;
  p.kit = kit;
  p.tiles = resolve_tiles(kit, options.tiles);
  p.tiles_requested = options.tiles.k > 0 || options.tiles.n > 0;
  p.runs_chunk = p.tiles_requested ? 0 : round_up(kit.runs_chunk, kit.format.depth);
  p.n = n;
  p.segment = segment;
  p.out_dtype = out_dtype;
  p.out_row_stride = out_row_stride;
  p.accumulate = accumulate;
  return p;
}

// Fills *options.trace, when set, with what a finished call ran.
inline void trace_call(const Options& options, const char* op, const Product& p, int threads,
                       std::int64_t extra_bytes, const OperandTrace& lhs, const OperandTrace& rhs) {
  if (options.trace == nullptr) return;
  CallTrace& t = *options.trace;
  t = CallTrace{};
  t.op = op;
  t.family = Family::v2;
  t.isa = p.kit.isa;
  t.tiles = p.tiles;
  t.threads = threads;
  t.extra_bytes = extra_bytes;
  t.streamed_tasks = p.streamed_tasks;
  t.output_past_caches = p.bypass_cache;
  t.lhs = lhs;
  t.rhs = rhs;
}

// What a caller-quantized (or unquantized) operand looked like.
inline OperandTrace caller_operand_trace(DType dtype, const Scales& scales) {
  return {dtype, is_quantized(dtype), scales.block, is_quantized(dtype) ? "caller" : ""};
}

// Work of a task in multiply-adds (at least one per output, for empty contractions).
inline double task_work(const Product& p, const Task& t) {
  const Job& job = p.jobs[t.job];
  return static_cast<double>(t.a1 - t.a0) * static_cast<double>(t.n1 - t.n0) *
         static_cast<double>(std::max<std::int64_t>(1, job.k_end - job.k_begin));
}

// Tasks at which parallel_for balances the workers' loads well enough.
constexpr int kTasksPerWorker = 4;

// How far over the even share of the work (total / workers) the busiest worker may end up when
// the packed row tasks stay whole (see split_tasks). Mixtral's fp8 forward (two groups of about
// 256 rows, two workers; ms, whole against cut): 144 against 154 with groups of 252 and 260
// rows, 151-156 against 155-158 with 240 and 272, level with 224 and 288 (12% over), 175-177
// against 155-161 with 200 and 312.
constexpr double kEvenShareSlack = 0.05;

// The tasks heaviest first (ties in their order).
inline void sort_heaviest_first(const Product& p, std::vector<Task>& tasks) {
  std::stable_sort(tasks.begin(), tasks.end(),
                   [&](const Task& a, const Task& b) { return task_work(p, a) > task_work(p, b); });
}

// True when `tasks` (heaviest first), each claimed by the worker that frees first as
// parallel_for hands them out, leave no worker more than kEvenShareSlack over the even share.
inline bool shared_evenly(const Product& p, const std::vector<Task>& tasks, int threads) {
  std::vector<double> loads(static_cast<std::size_t>(threads), 0.0);
  double total = 0;
  for (const Task& t : tasks) {
    const double work = task_work(p, t);
    *std::min_element(loads.begin(), loads.end()) += work;
    total += work;
  }
  return *std::max_element(loads.begin(), loads.end()) <= (1 + kEvenShareSlack) * total / threads;
}

// The tasks of a call: each job's rows cut into blocks of tiles.m, all columns. A task the kit
// streams (streams()) is cut into column ranges of stream_columns() whatever the thread count
// (one group of one row still keeps every worker busy). With several workers that cannot share
// the tasks evenly as they are (shared_evenly), another task heavier than 1 / (kTasksPerWorker *
// threads) of the call's work (one large group, as in the compute-bound shape with a number of
// row blocks the workers do not divide) is cut into column ranges of whole tiles.n blocks, none
// much heavier than that; a packed task of a few rows too (one group of 8 rows over 4096 x 14336
// fp8 weights on the AMX kit, 2 threads: 7.8-8.0 ms whole, 4.6-4.9 cut). Tasks stay whole where
// they can because cut ones cost more: each column range packs (and quantizes) the task's A rows
// again (the compute-bound fp8 forward's two row blocks on two workers, cut into four ranges each,
// spent 5% of the call packing A, and ran 4% slower than whole; its dlhs too). The tasks come
// heaviest first, so the workers, which claim them in order, end on the lightest ones. Results
// depend on neither: every element of C sums the same contraction chunks in the same order whatever
// its task's columns and whenever its task runs.
inline std::vector<Task> split_tasks(const Product& p, int threads) {
  std::vector<Task> whole;  // streamed tasks cut into their column ranges, packed tasks whole
  double total = 0;
  for (std::int64_t j = 0; j < static_cast<std::int64_t>(p.jobs.size()); ++j) {
    const Job& job = p.jobs[j];
    for (std::int64_t a = job.a_begin; a < job.a_end; a += p.tiles.m) {
      const Task t{j, a, std::min(job.a_end, a + p.tiles.m), 0, p.n};
      total += task_work(p, t);
      if (streams(p, job, t.a1 - t.a0)) {
        const std::int64_t columns = stream_columns(job.b.source);
        for (std::int64_t n = 0; n < p.n; n += columns) {
          whole.push_back({t.job, t.a0, t.a1, n, std::min(p.n, n + columns), true});
        }
      } else {
        whole.push_back(t);
      }
    }
  }
  std::vector<Task> tasks = whole;
  sort_heaviest_first(p, tasks);
  if (threads <= 1 || shared_evenly(p, tasks, threads)) return tasks;

  const double target = total / (kTasksPerWorker * threads);
  const std::int64_t column_blocks = (p.n + p.tiles.n - 1) / p.tiles.n;
  tasks.clear();
  for (const Task& t : whole) {
    const bool cuttable = !t.stream;
    const std::int64_t pieces =
        cuttable
            ? std::clamp<std::int64_t>(
                  static_cast<std::int64_t>(std::ceil(task_work(p, t) / target)), 1, column_blocks)
            : 1;
    if (pieces == 1) {
      tasks.push_back(t);
      continue;
    }
    const std::int64_t blocks_per_piece = (column_blocks + pieces - 1) / pieces;
    for (std::int64_t b = 0; b < column_blocks; b += blocks_per_piece) {
      tasks.push_back(
          {t.job, t.a0, t.a1, b * p.tiles.n, std::min(p.n, (b + blocks_per_piece) * p.tiles.n)});
    }
  }
  sort_heaviest_first(p, tasks);
  return tasks;
}

// Outputs of at least this many bytes (beyond the last-level cache of most CPUs, so never read
// back from cache) are written with non-temporal stores, which skip reading each line before
// writing it: the weight gradient of the DeepSeek-V3 shapes is written once, 29 MB per expert.
constexpr std::int64_t kBypassCacheBytes = 32 * 1024 * 1024;

// Computes the absmax tables, splits every job into tasks (split_tasks: results do not depend on
// the thread count) and runs them on `threads` workers. Returns the peak bytes of all buffers.
inline std::int64_t run_product(Product& p, int threads, int* threads_used) {
  std::int64_t out_bytes = 0;
  for (const Job& job : p.jobs) {
    out_bytes += (job.a_end - job.a_begin) * p.n * static_cast<std::int64_t>(size_of(p.out_dtype));
  }
  // Only outputs whose rows start on cache lines, or whose rows follow each other off their lines
  // (write_whole_rows joins them): otherwise each row's end lines are partly written, one way or
  // the other, and such lines cost far more than they save.
  const std::int64_t element = static_cast<std::int64_t>(size_of(p.out_dtype));
  const std::int64_t row_bytes = p.out_row_stride * element;
  bool rows_on_lines = row_bytes % kernels::kCacheLineBytes == 0;
  bool rows_joinable = p.out_row_stride == p.n && row_bytes >= 2 * kernels::kCacheLineBytes;
  for (const Job& job : p.jobs) {
    const auto address = reinterpret_cast<std::uintptr_t>(job.out);
    rows_on_lines = rows_on_lines && address % kernels::kCacheLineBytes == 0;
    rows_joinable = rows_joinable && address % static_cast<std::uintptr_t>(element) == 0;
  }
  p.rows_on_lines = rows_on_lines;
  p.bypass_cache = !p.accumulate && p.kit.store_row != nullptr && p.kit.store_fence != nullptr &&
                   out_bytes >= kBypassCacheBytes && (rows_on_lines || rows_joinable);
  p.rows_joined = p.bypass_cache && !rows_on_lines;
  // absmax scales of in-kernel quantization: one table per side and lane range (consecutive jobs
  // on the same lanes of the same source share it), each block a job touches computed once, in
  // lane chunks
  struct TableSide {
    std::int64_t table;
    bool a_side;
    std::int64_t job;  // a job reading it (for the side's source and scales)
  };
  std::vector<TableSide> sides;
  std::vector<std::vector<bool>> touched;  // per table: which of its blocks some job reads
  std::int64_t last[2] = {-1, -1};         // latest table of the A and B sides
  for (std::int64_t j = 0; j < static_cast<std::int64_t>(p.jobs.size()); ++j) {
    Job& job = p.jobs[j];
    for (bool a_side : {true, false}) {
      const Side& side = a_side ? job.a : job.b;
      if (side.scales.kind != SideScales::Kind::absmax || job.k_end <= job.k_begin) continue;
      const std::int64_t begin = a_side ? job.a_begin : 0, end = a_side ? job.a_end : p.n;
      const std::int64_t size = side.scales.quant_block;
      const std::int64_t block0 = job.k_begin / size, block_end = (job.k_end - 1) / size + 1;
      std::int64_t& t = last[a_side ? 0 : 1];
      bool shared = false;
      if (t >= 0) {
        const AbsmaxTable& prior = p.tables[static_cast<std::size_t>(t)];
        const Job& owner = p.jobs[sides[static_cast<std::size_t>(t)].job];
        const Side& prior_side = a_side ? owner.a : owner.b;
        const std::int64_t prior_end =
            a_side ? prior.lane_begin + (owner.a_end - owner.a_begin) : p.n;
        shared = prior_side.source.data == side.source.data && prior.lane_begin == begin &&
                 prior_end == end && prior_side.scales.quant_block == size &&
                 block0 >= prior.block0;
      }
      if (!shared) {
        t = static_cast<std::int64_t>(p.tables.size());
        p.tables.push_back({{}, begin, block0, 0});
        sides.push_back({t, a_side, j});
        touched.emplace_back();
      }
      AbsmaxTable& table = p.tables[static_cast<std::size_t>(t)];
      table.blocks = std::max(table.blocks, block_end - table.block0);
      std::vector<bool>& marks = touched[static_cast<std::size_t>(t)];
      marks.resize(static_cast<std::size_t>(table.blocks), false);
      for (std::int64_t b = block0; b < block_end; ++b) marks[b - table.block0] = true;
      (a_side ? job.a_table : job.b_table) = t;
    }
  }
  struct TableTask {
    std::int64_t side, block, lane0, lanes;
  };
  constexpr std::int64_t kTableLanes = 256;
  std::vector<TableTask> table_tasks;
  std::int64_t table_bytes = 0;
  for (std::int64_t s = 0; s < static_cast<std::int64_t>(sides.size()); ++s) {
    AbsmaxTable& table = p.tables[static_cast<std::size_t>(sides[s].table)];
    const Job& job = p.jobs[sides[s].job];
    const std::int64_t lanes = sides[s].a_side ? job.a_end - job.a_begin : p.n;
    table.values.resize(static_cast<std::size_t>(lanes * table.blocks));
    table_bytes += static_cast<std::int64_t>(table.values.size() * sizeof(float));
    for (std::int64_t b = 0; b < table.blocks; ++b) {
      if (!touched[static_cast<std::size_t>(s)][b]) continue;
      for (std::int64_t l = table.lane_begin; l < table.lane_begin + lanes; l += kTableLanes) {
        table_tasks.push_back(
            {s, table.block0 + b, l, std::min(kTableLanes, table.lane_begin + lanes - l)});
      }
    }
  }
  std::vector<std::vector<float>> scratch(static_cast<std::size_t>(std::max(1, threads)));
  parallel_for(static_cast<std::int64_t>(table_tasks.size()), threads,
               [&](std::int64_t i, int worker) {
                 const TableTask& t = table_tasks[i];
                 const TableSide& side = sides[static_cast<std::size_t>(t.side)];
                 const Job& job = p.jobs[side.job];
                 fill_absmax_table(p.kit, side.a_side ? job.a : job.b,
                                   p.tables[static_cast<std::size_t>(side.table)], t.block, t.lane0,
                                   t.lanes, scratch[worker]);
               });

  std::vector<Task> tasks = split_tasks(p, threads);
  for (const Task& t : tasks) p.streamed_tasks += t.stream;
  const int workers = static_cast<int>(std::max<std::int64_t>(
      1, std::min<std::int64_t>(threads, static_cast<std::int64_t>(tasks.size()))));
  *threads_used = workers;
  std::vector<Workspace> spaces(static_cast<std::size_t>(workers));
  parallel_for(static_cast<std::int64_t>(tasks.size()), workers, [&](std::int64_t i, int worker) {
    const Task& t = tasks[i];
    if (t.stream) {
      run_stream_task(p, t, spaces[worker]);
    } else {
      run_task(p, t, spaces[worker]);
    }
  });
  std::int64_t bytes = table_bytes;
  if (p.streamed_tasks > 0) bytes += workers * p.kit.stream_scratch_bytes;
  for (const Workspace& w : spaces) bytes += w.bytes();
  for (const auto& v : scratch) bytes += static_cast<std::int64_t>(v.capacity() * sizeof(float));
  return bytes;
}

}  // namespace gmm::v2::detail
