// Kernel family v2: gmm (forward, and dlhs with transpose_rhs) as one fused, blocked pass.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "gmm/core/parallel.hpp"
#include "gmm/core/problem.hpp"
#include "gmm/kernels/cpu.hpp"
#include "gmm/kernels/select.hpp"
#include "gmm/v2/driver.hpp"

namespace gmm::v2 {

namespace detail {

// Scales of the gmm lhs (lanes = rows, contraction = K): stored, computed in the kernel, or none.
inline SideScales gmm_lhs_scales(const GmmProblem& p) {
  SideScales s;
  if (p.quantize_lhs) {
    if (p.quantize_lhs->calibration.method == Calibration::Method::fixed) {
      s.kind = SideScales::Kind::fixed;
      s.fixed = p.quantize_lhs->calibration.static_scale(p.quantize_lhs->qtype);
    } else {
      s.kind = SideScales::Kind::absmax;
      s.quant_block = p.quantize_lhs->block;
      s.k_extent = p.k;
    }
  } else if (is_quantized(p.lhs.dtype)) {
    const BlockShape& b = p.lhs.scales.block;
    s.kind = SideScales::Kind::stored;
    s.data = p.lhs.scales.data;
    s.lane_block = b.rows;
    s.lane_step = p.k / b.cols;
    s.k_block = b.cols;
    s.k_step = 1;
  }
  return s;
}

// Scales of group g's weights (lanes = N, contraction = K), [K, N] or [N, K] when transposed.
inline SideScales gmm_rhs_scales(const GmmProblem& p, std::int64_t g) {
  SideScales s;
  if (!is_quantized(p.rhs.dtype)) return s;
  const GroupedMatrix& w = p.rhs;
  const BlockShape& b = w.scales.block;
  s.kind = SideScales::Kind::stored;
  s.data = w.scales.data + (g / b.groups) * (w.rows / b.rows) * (w.cols / b.cols);
  if (p.transpose_rhs) {  // [N, K]
    s.lane_block = b.rows;
    s.lane_step = w.cols / b.cols;
    s.k_block = b.cols;
    s.k_step = 1;
  } else {  // [K, N]
    s.lane_block = b.cols;
    s.lane_step = 1;
    s.k_block = b.rows;
    s.k_step = w.cols / b.cols;
  }
  return s;
}

}  // namespace detail

inline void gmm(const GmmProblem& p, const Options& options) {
  const bool quantize = p.quantize_lhs.has_value();
  const kernels::KernelKit kit = kernels::call_kit(
      "gmm::v2::gmm", options.isa,
      detail::exact_in_bf16(p.lhs.dtype, quantize) && detail::exact_in_bf16(p.rhs.dtype, false));
  detail::Product product = detail::make_product(kit, options, p.n, p.k_segment, p.out.dtype,
                                                 p.out.row_stride, p.accumulate);

  kernels::PanelSource lhs{
      p.lhs.data, p.lhs.dtype, p.lhs.row_stride,
      1,          quantize,    quantize ? p.quantize_lhs->qtype : QType::float8_e4m3fn};
  const detail::SideScales lhs_scales = detail::gmm_lhs_scales(p);
  std::vector<bool> owned(static_cast<std::size_t>(p.m), false);
  for (std::int64_t g = 0; g < p.groups.count(); ++g) {
    if (p.groups.size(g) == 0) continue;
    std::fill(owned.begin() + p.groups.begin[g], owned.begin() + p.groups.end[g], true);
    const auto* weights = static_cast<const unsigned char*>(p.rhs.data) +
                          g * p.rhs.group_stride * static_cast<std::int64_t>(size_of(p.rhs.dtype));
    kernels::PanelSource rhs{weights, p.rhs.dtype, p.transpose_rhs ? p.rhs.row_stride : 1,
                             p.transpose_rhs ? 1 : p.rhs.row_stride};
    rhs.depth = p.k;
    detail::Job job;
    job.a = {lhs, lhs_scales};
    job.b = {rhs, detail::gmm_rhs_scales(p, g)};
    job.a_begin = p.groups.begin[g];
    job.a_end = p.groups.end[g];
    job.k_end = p.k;
    job.out = p.out.data;
    if (p.n > 0) product.jobs.push_back(job);
  }
  if (!p.accumulate) {  // rows of no local group are exact zeros
    const std::size_t bytes = static_cast<std::size_t>(p.n) * size_of(p.out.dtype);
    for (std::int64_t r = 0; r < p.m; ++r) {
      if (!owned[r]) {
        std::memset(static_cast<unsigned char*>(p.out.data) +
                        r * p.out.row_stride * static_cast<std::int64_t>(size_of(p.out.dtype)),
                    0, bytes);
      }
    }
  }
  int threads_used = 1;
  const std::int64_t extra_bytes =
      detail::run_product(product, resolve_threads(options.threads), &threads_used);

  OperandTrace lhs_trace = detail::caller_operand_trace(p.lhs.dtype, p.lhs.scales);
  if (quantize) {
    const bool fixed = p.quantize_lhs->calibration.method == Calibration::Method::fixed;
    lhs_trace = {dtype_of(p.quantize_lhs->qtype), true,
                 fixed ? BlockShape{1, p.m, p.k} : BlockShape{1, 1, p.quantize_lhs->block},
                 "in kernel"};
  }
  detail::trace_call(options, "gmm", product, threads_used,
                     extra_bytes + static_cast<std::int64_t>(owned.capacity() / 8), lhs_trace,
                     detail::caller_operand_trace(p.rhs.dtype, p.rhs.scales));
}

}  // namespace gmm::v2
