// The blocked product shared by v2 gmm and tgmm: tasks over (group, row block, column block),
// contraction chunks inside scale segments, packing into the kernel's format, fp32 epilogue.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gmm/core/dtype.hpp"
#include "gmm/core/parallel.hpp"
#include "gmm/core/qvalue.hpp"
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

// One group's product: C lanes [a_begin, a_end) x [0, n) over contraction [k_begin, k_end);
// element (i, j) of C is stored at out + (i * row_stride + j) elements.
struct Job {
  Side a, b;
  std::int64_t a_begin = 0, a_end = 0, k_begin = 0, k_end = 0;
  void* out = nullptr;
};

// The whole call: its jobs and everything they share.
struct Product {
  kernels::KernelKit kit;
  Tiles tiles;               // rows, contraction and columns per task
  std::int64_t n = 0;        // columns of C
  std::int64_t segment = 1;  // scales are constant within aligned contraction segments
  DType out_dtype = DType::f32;
  std::int64_t out_row_stride = 0;
  bool accumulate = false;
  std::vector<Job> jobs;
};

// Per-thread buffers: packed panels, the fp32 tile of C, per-lane scales and absmax tables.
struct Workspace {
  std::vector<unsigned char> a_packed, b_packed;
  std::vector<float> c, a_scales, b_scales, a_table, b_table, absmax;

  std::int64_t bytes() const {
    return static_cast<std::int64_t>(a_packed.capacity() + b_packed.capacity() +
                                     sizeof(float) *
                                         (c.capacity() + a_scales.capacity() + b_scales.capacity() +
                                          a_table.capacity() + b_table.capacity()));
  }
};

// One unit of parallel work: C lanes [a0, a1) x [b0, b1) of one job, over its whole contraction.
struct Task {
  std::int64_t job = 0, a0 = 0, a1 = 0, b0 = 0, b1 = 0;
};

// True when an operand enters the product exactly representable in bf16.
inline bool exact_in_bf16(DType dtype, bool quantized_in_kernel) {
  return quantized_in_kernel || dtype != DType::f32;
}

inline std::int64_t round_up(std::int64_t x, std::int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

// Absmax scales of lanes [lane0, lane0 + lanes) and contraction blocks [block0, block1) of an
// f32 / bf16 source, as table[lane][block - block0] (core/qvalue.hpp rules).
inline void absmax_table(const kernels::KernelKit& kit, const Side& side, std::int64_t lane0,
                         std::int64_t lanes, std::int64_t block0, std::int64_t block1, float* table,
                         std::vector<float>& scratch) {
  const std::int64_t blocks = block1 - block0, size = side.scales.quant_block;
  scratch.resize(static_cast<std::size_t>(lanes));
  for (std::int64_t b = block0; b < block1; ++b) {
    kit.absmax(side.source, lane0, lanes, b * size, std::min(side.scales.k_extent, (b + 1) * size),
               scratch.data());
    for (std::int64_t w = 0; w < lanes; ++w) {
      table[w * blocks + (b - block0)] = gmm::detail::absmax_scale(scratch[w], side.source.qtype);
    }
  }
}

// Scales of one side for lanes [lane0, lane0 + lanes) in the contraction chunk starting at k
// (padded lanes up to `padded` get 0); `table` holds absmax scales from block `block0` on.
inline void chunk_scales(const Side& side, std::int64_t lane0, std::int64_t lanes,
                         std::int64_t padded, std::int64_t k, const float* table,
                         std::int64_t table_blocks, std::int64_t block0, float* out) {
  const SideScales& s = side.scales;
  for (std::int64_t w = 0; w < lanes; ++w) {
    switch (s.kind) {
      case SideScales::Kind::none:
        out[w] = 1.0f;
        break;
      case SideScales::Kind::fixed:
        out[w] = s.fixed;
        break;
      case SideScales::Kind::stored:
        out[w] = s.data[((lane0 + w) / s.lane_block) * s.lane_step + (k / s.k_block) * s.k_step];
        break;
      case SideScales::Kind::absmax:
        out[w] = table[w * table_blocks + (k / s.quant_block - block0)];
        break;
    }
  }
  std::fill(out + lanes, out + padded, 0.0f);
}

// Stores the fp32 tile of a task into the output (once rounded for bf16; added when
// accumulating).
inline void write_tile(const Product& p, const Job& job, const Task& t, const float* c,
                       std::int64_t ldc) {
  const std::int64_t cols = t.b1 - t.b0;
  for (std::int64_t i = t.a0; i < t.a1; ++i) {
    const float* src = c + (i - t.a0) * ldc;
    const std::int64_t offset = i * p.out_row_stride + t.b0;
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

// Computes one task: for each contraction chunk, pack the A panels of the task's rows and the B
// panels of its columns, then run the micro-kernel down the rows of each B panel (which stays
// in L1 while the A block streams from L2); finally store the tile.
inline void run_task(const Product& p, const Task& t, Workspace& ws) {
  const Job& job = p.jobs[t.job];
  const kernels::PackedFormat& f = p.kit.format;
  const std::int64_t rows = t.a1 - t.a0, cols = t.b1 - t.b0;
  const std::int64_t rows_padded = round_up(rows, f.mr), ldc = round_up(cols, f.nr);
  const std::int64_t max_kc =
      std::max<std::int64_t>(1, std::min(p.tiles.k, job.k_end - job.k_begin));
  ws.c.resize(static_cast<std::size_t>(rows_padded * ldc));
  ws.a_scales.resize(static_cast<std::size_t>(rows_padded));
  ws.b_scales.resize(static_cast<std::size_t>(ldc));
  ws.a_packed.resize((rows_padded / f.mr) * f.panel_bytes(f.mr, max_kc));
  ws.b_packed.resize((ldc / f.nr) * f.panel_bytes(f.nr, max_kc));

  // absmax tables over the contraction blocks this task touches
  std::int64_t a_block0 = 0, a_blocks = 0, b_block0 = 0, b_blocks = 0;
  if (job.k_end > job.k_begin) {
    if (job.a.scales.kind == SideScales::Kind::absmax) {
      const std::int64_t size = job.a.scales.quant_block;
      a_block0 = job.k_begin / size;
      a_blocks = (job.k_end - 1) / size + 1 - a_block0;
      ws.a_table.resize(static_cast<std::size_t>(rows * a_blocks));
      absmax_table(p.kit, job.a, t.a0, rows, a_block0, a_block0 + a_blocks, ws.a_table.data(),
                   ws.absmax);
    }
    if (job.b.scales.kind == SideScales::Kind::absmax) {
      const std::int64_t size = job.b.scales.quant_block;
      b_block0 = job.k_begin / size;
      b_blocks = (job.k_end - 1) / size + 1 - b_block0;
      ws.b_table.resize(static_cast<std::size_t>(cols * b_blocks));
      absmax_table(p.kit, job.b, t.b0, cols, b_block0, b_block0 + b_blocks, ws.b_table.data(),
                   ws.absmax);
    }
  }

  bool first = true;
  for (std::int64_t k = job.k_begin; k < job.k_end;) {
    const std::int64_t kc = std::min({job.k_end, (k / p.segment + 1) * p.segment, k + max_kc}) - k;
    chunk_scales(job.a, t.a0, rows, rows_padded, k, ws.a_table.data(), a_blocks, a_block0,
                 ws.a_scales.data());
    chunk_scales(job.b, t.b0, cols, ldc, k, ws.b_table.data(), b_blocks, b_block0,
                 ws.b_scales.data());
    const std::int64_t steps = f.steps(kc);
    const std::size_t a_panel = f.panel_bytes(f.mr, kc), b_panel = f.panel_bytes(f.nr, kc);
    p.kit.pack_a(job.a.source, f.mr, t.a0, rows, k, kc, ws.a_scales.data(), ws.a_packed.data());
    p.kit.pack_b(job.b.source, f.nr, t.b0, cols, k, kc, ws.b_scales.data(), ws.b_packed.data());
    for (std::int64_t jr = 0; jr < ldc; jr += f.nr) {
      for (std::int64_t ir = 0; ir < rows_padded; ir += f.mr) {
        p.kit.kernel(steps, ws.a_packed.data() + (ir / f.mr) * a_panel,
                     ws.b_packed.data() + (jr / f.nr) * b_panel, ws.c.data() + ir * ldc + jr, ldc,
                     ws.a_scales.data() + ir, ws.b_scales.data() + jr, first);
      }
    }
    first = false;
    k += kc;
  }
  if (first) std::fill(ws.c.begin(), ws.c.end(), 0.0f);
  write_tile(p, job, t, ws.c.data(), ldc);
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

// Splits every job into tasks (independent of the thread count, so results are too) and runs
// them on `threads` workers. Returns the peak bytes of all per-thread buffers.
inline std::int64_t run_product(const Product& p, int threads, int* threads_used) {
  std::vector<Task> tasks;
  for (std::int64_t j = 0; j < static_cast<std::int64_t>(p.jobs.size()); ++j) {
    const Job& job = p.jobs[j];
    for (std::int64_t a = job.a_begin; a < job.a_end; a += p.tiles.m) {
      for (std::int64_t b = 0; b < p.n; b += p.tiles.n) {
        tasks.push_back(
            {j, a, std::min(job.a_end, a + p.tiles.m), b, std::min(p.n, b + p.tiles.n)});
      }
    }
  }
  const int workers = static_cast<int>(std::max<std::int64_t>(
      1, std::min<std::int64_t>(threads, static_cast<std::int64_t>(tasks.size()))));
  *threads_used = workers;
  std::vector<Workspace> spaces(static_cast<std::size_t>(workers));
  parallel_for(static_cast<std::int64_t>(tasks.size()), workers,
               [&](std::int64_t i, int worker) { run_task(p, tasks[i], spaces[worker]); });
  std::int64_t bytes = 0;
  for (const Workspace& w : spaces) bytes += w.bytes();
  return bytes;
}

}  // namespace gmm::v2::detail
