// The fwd, dlhs and drhs passes of one expert layer under a Plan and a Recipe: what a trainer
// calls.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "gmm/core/error.hpp"
#include "gmm/core/parallel.hpp"
#include "gmm/core/problem.hpp"
#include "gmm/core/quantize.hpp"
#include "gmm/kernels/cpu.hpp"
#include "gmm/ops.hpp"
#include "gmm/plan.hpp"
#include "gmm/recipe.hpp"
#include "gmm/trace.hpp"

namespace gmm {

// The operands of one expert layer y[rows of local group g] = x @ W_g, as views: the caller owns
// the data and keeps it alive until backward has run.
//   x  [M, K]: f32 / bf16, or pre-quantized with the recipe's act qtype (for instance quantized
//      before an expert-parallel all-gather so fp8 moves instead of bf16);
//   w  [G, K, N]: f32 / bf16 (forward quantizes it when the recipe has a weight rule), or
//      pre-quantized with the recipe's weight qtype and scale layout (see quantize_weight).
struct ExpertLayer {
  Matrix x;
  GroupedMatrix w;
  GroupSizes group_sizes;         // E >= G global experts' sizes
  std::int64_t group_offset = 0;  // first global expert held locally
};

// How the passes run, not what they compute.
struct PassOptions {
  int threads = 0;               // 0: all hardware threads
  Isa isa = Isa::automatic;      // forced micro-kernel ISA of v2 passes (v1 has no choice)
  std::array<Tiles, 3> tiles{};  // per pass (fwd, dlhs, drhs); zeros: the family's defaults
  Trace* trace = nullptr;        // filled when non-null
  // The auto plan's rule (how a plan's auto passes choose); the default is calibrated on this
  // project's benchmarks.
  AutoThresholds auto_rule = auto_thresholds;
};

// What forward keeps for backward: the layer's views, the recipe (backward must quantize as
// forward did), and Q_w(w) when forward quantized the weights, so backward reuses the same
// qvalues and scales instead of quantizing again.
struct Saved {
  ExpertLayer layer;
  Recipe recipe;
  std::optional<QArray> quantized_weight;

  // The weights the passes multiply: Q_w(w), or w itself when it is unquantized or arrived
  // pre-quantized.
  GroupedMatrix weight() const { return quantized_weight ? quantized_weight->grouped() : layer.w; }
};

// The outputs of backward. A null data pointer skips that pass (the first layer of a network
// needs no dx).
struct Gradients {
  OutMatrix dx;                // [M, K], f32 or bf16
  OutGroupedMatrix dw;         // [G, K, N], f32 or bf16
  bool accumulate_dw = false;  // dw += gradient (accumulation over micro-batches)
};

// Q_w(w): the weights quantized with the recipe's weight rule and scale layout (per-channel
// scales shared across experts are Qwix's; they also let backward fold one scale per column).
// Quantize once per optimizer step and pass the result to forward as a pre-quantized w.
// `threads` 0 uses every hardware thread; the result does not depend on it.
inline QArray quantize_weight(const GroupedMatrix& w, const Recipe& recipe, int threads = 0) {
  constexpr const char* where = "gmm::quantize_weight";
  recipe.validate();
  detail::require(recipe.weight.has_value(), where, "recipe.weight", "a weight rule", "none");
  const BlockShape block = recipe.weight_block(w.groups, w.rows, w.cols);
  detail::check_block(where, "recipe weight", "K (weight_block_k)", block.rows, w.rows);
  detail::check_block(where, "recipe weight", "N (weight_block_n)", block.cols, w.cols);
  return quantize(w, recipe.weight->qtype, block, recipe.weight->calibration, threads);
}

namespace detail {

// The scale that stands for "already folded": the weight qvalues enter dlhs with scale 1.
inline constexpr float unit_scale = 1.0f;

inline std::int64_t local_rows(const GroupRows& rows) {
  std::int64_t total = 0;
  for (std::int64_t g = 0; g < rows.count(); ++g) total += rows.size(g);
  return total;
}

// The shape the auto plan sees for a pass over the rows of local groups.
inline PassShape pass_shape(const GroupRows& rows, Arithmetic arithmetic) {
  std::int64_t owning = 0;
  for (std::int64_t g = 0; g < rows.count(); ++g) owning += rows.size(g) > 0 ? 1 : 0;
  return {owning, local_rows(rows), arithmetic};
}

inline Options pass_call_options(Pass pass, Family family, const ExpertLayer& layer,
                                 const PassOptions& options, CallTrace* trace) {
  Options o;
  o.family = family;
  o.group_offset = layer.group_offset;
  o.tiles = options.tiles[static_cast<int>(pass)];
  o.threads = options.threads;
  o.isa = family == Family::v2 ? options.isa : Isa::automatic;
  o.trace = trace;
  return o;
}

// The trace entry of `pass` (reset), or nullptr when no trace was asked for.
inline PassTrace* start_trace(const PassOptions& options, Pass pass, Family planned) {
  if (options.trace == nullptr) return nullptr;
  auto& entry = options.trace->passes[static_cast<int>(pass)];
  entry = PassTrace{};
  entry->pass = pass;
  entry->planned = planned;
  return &*entry;
}

inline QuantSpec quant_spec(const QuantRule& rule, std::int64_t block) {
  return {rule.qtype, rule.calibration, block};
}

// Checks x and w against the recipe (forward's input errors).
inline void check_layer(const char* where, const ExpertLayer& layer, const Recipe& recipe) {
  const Matrix& x = layer.x;
  const GroupedMatrix& w = layer.w;
  if (is_quantized(x.dtype)) {
    require(recipe.act.has_value(), where, "x dtype", "f32 or bf16 (the recipe has no act rule)",
            x.dtype);
    require(x.dtype == dtype_of(recipe.act->qtype), where, "x dtype",
            fmt::format("{} (the recipe's act qtype) or f32 / bf16", recipe.act->qtype), x.dtype);
    require(recipe.act->calibration.method == Calibration::Method::absmax, where, "x dtype",
            "f32 or bf16: a static (fixed) activation scale cannot apply to a pre-quantized "
            "activation",
            x.dtype);
  } else if (recipe.act && recipe.act_block_k > 0 && recipe.act_block_k < x.cols) {
    check_block(where, "recipe act", "K (act_block_k)", recipe.act_block_k, x.cols);
  }
  if (is_quantized(w.dtype)) {
    require(recipe.weight.has_value(), where, "w dtype",
            "f32 or bf16 (the recipe has no weight rule)", w.dtype);
    require(w.dtype == dtype_of(recipe.weight->qtype), where, "w dtype",
            fmt::format("{} (the recipe's weight qtype) or f32 / bf16", recipe.weight->qtype),
            w.dtype);
    const BlockShape expected = recipe.weight_block(w.groups, w.rows, w.cols);
    require(
        w.scales.block == expected, where, "w scale block",
        fmt::format("{}x{}x{} ({} in the recipe)", expected.groups, expected.rows, expected.cols,
                    name(recipe.weight_scale)),
        fmt::format("{}x{}x{}", w.scales.block.groups, w.scales.block.rows, w.scales.block.cols));
  }
}

// Per-channel weight scales (one per column of each expert, or shared): dlhs contracts over N,
// so these are folded into dy.
inline bool has_per_channel_scales(const GroupedMatrix& w) {
  return is_quantized(w.dtype) && w.scales.block.rows == w.rows && w.scales.block.cols == 1 &&
         w.cols > 1;
}

// folded[r, n] = dy[r, n] * s_w[g(r), n] in fp32 for rows of local groups, 0 elsewhere.
template <typename T>
void fold_weight_scales(const T* dy, std::int64_t dy_stride, const GroupedMatrix& w,
                        const GroupRows& rows, int threads, float* folded) {
  const std::int64_t n = w.cols;
  parallel_for(rows.count(), threads, [&](std::int64_t g, int) {
    const float* scale = w.scales.data + (g / w.scales.block.groups) * n;
    for (std::int64_t r = rows.begin[g]; r < rows.end[g]; ++r) {
      for (std::int64_t c = 0; c < n; ++c) {
        folded[r * n + c] = static_cast<float>(dy[r * dy_stride + c]) * scale[c];
      }
    }
  });
}

}  // namespace detail

// Forward pass y = Q_a(x) @ Q_w(w) per local group (see Recipe for the scale layouts), run by
// the family the plan names for fwd. Rows no local group owns are written as zeros. Returns
// what backward needs. Throws gmm::Error before writing y when the input or the recipe is
// invalid.
inline Saved forward(const ExpertLayer& layer, const OutMatrix& y, const Plan& plan,
                     const Recipe& recipe, const PassOptions& options = {}) {
  constexpr const char* where = "gmm::forward";
  recipe.validate();
  detail::check_layer(where, layer, recipe);
  const GroupRows rows = detail::local_group_rows(where, layer.group_sizes, layer.w.groups,
                                                  layer.group_offset, layer.x.rows);
  Saved saved{layer, recipe, std::nullopt};
  std::int64_t layer_bytes = 0;
  if (recipe.weight && !is_quantized(layer.w.dtype)) {
    saved.quantized_weight = quantize_weight(layer.w, recipe, options.threads);
    layer_bytes = static_cast<std::int64_t>(saved.quantized_weight->qvalue.size() +
                                            saved.quantized_weight->scale.size() * sizeof(float));
  }
  const GroupedMatrix w = saved.weight();
  const bool quantize_x = recipe.act && !is_quantized(layer.x.dtype);
  const PassShape shape =
      detail::pass_shape(rows, arithmetic_of(layer.x.dtype, quantize_x, w.dtype, false));
  const Family family = plan.family(Pass::fwd, shape, options.auto_rule);
  PassTrace* trace = detail::start_trace(options, Pass::fwd, family);
  Options o =
      detail::pass_call_options(Pass::fwd, family, layer, options, trace ? &trace->call : nullptr);
  if (quantize_x) o.quantize_lhs = detail::quant_spec(*recipe.act, recipe.act_block_k);
  if (trace) trace->layer_bytes = layer_bytes;
  gmm(layer.x, w, layer.group_sizes, y, o);
  return saved;
}

// Backward passes of the layer forward saved, given dy [M, N] (f32 or bf16):
//   dlhs dx = Q_g(dy) @ Q_w(w)^T and drhs dw = Q_a(x)^T @ Q_g(dy) (see Recipe), each run by the
// family the plan names for it. Both calls are validated before either output is written;
// gmm::Error is thrown otherwise.
inline void backward(const Saved& saved, const Matrix& dy, const Gradients& grads, const Plan& plan,
                     const PassOptions& options = {}) {
  constexpr const char* where = "gmm::backward";
  using detail::require;
  const ExpertLayer& layer = saved.layer;
  const Recipe& recipe = saved.recipe;
  const GroupedMatrix w = saved.weight();
  const std::int64_t m = layer.x.rows, n = w.cols;
  require(dy.dtype == DType::f32 || dy.dtype == DType::bf16, where, "dy dtype", "f32 or bf16",
          dy.dtype);
  detail::check_matrix(where, "dy", dy.data, dy.rows, dy.cols, dy.row_stride);
  detail::check_extent(where, "dy rows (M)", dy.rows, m);
  detail::check_extent(where, "dy cols (N)", dy.cols, n);
  if (recipe.drhs_block_m > 0 && recipe.drhs_block_m < m) {
    detail::check_block(where, "recipe drhs", "M (drhs_block_m)", recipe.drhs_block_m, m);
  }
  const GroupRows rows =
      detail::local_group_rows(where, layer.group_sizes, w.groups, layer.group_offset, m);

  // dlhs: dx = Q_g(dy) @ Q_w(w)^T, with per-channel weight scales folded into dy.
  const bool run_dlhs = grads.dx.data != nullptr;
  const bool fold = detail::has_per_channel_scales(w);
  std::vector<float> folded;
  Matrix dlhs_lhs = dy;
  GroupedMatrix dlhs_rhs = w;
  if (run_dlhs && fold) {
    folded.assign(static_cast<std::size_t>(m * n), 0.0f);
    dlhs_lhs = view(folded.data(), m, n);
    dlhs_rhs.scales = {&detail::unit_scale, {w.groups, w.rows, w.cols}};
  }
  const PassShape dlhs_shape = detail::pass_shape(
      rows, arithmetic_of(dlhs_lhs.dtype, recipe.grad.has_value(), dlhs_rhs.dtype, false));
  const Family dlhs_family = plan.family(Pass::dlhs, dlhs_shape, options.auto_rule);
  Options dlhs = detail::pass_call_options(Pass::dlhs, dlhs_family, layer, options, nullptr);
  dlhs.transpose_rhs = true;
  if (recipe.grad) {
    const bool n_blocks = is_quantized(w.dtype) && !fold;
    dlhs.quantize_lhs = detail::quant_spec(*recipe.grad, n_blocks ? w.scales.block.cols : 0);
  }

  // drhs: dw = Q_a(x)^T @ Q_g(dy), both quantized in the call with blocks along M.
  const bool run_drhs = grads.dw.data != nullptr;
  const bool quantize_x = recipe.act && !is_quantized(layer.x.dtype);
  const PassShape drhs_shape = detail::pass_shape(
      rows, arithmetic_of(layer.x.dtype, quantize_x, dy.dtype, recipe.grad.has_value()));
  const Family drhs_family = plan.family(Pass::drhs, drhs_shape, options.auto_rule);
  Options drhs = detail::pass_call_options(Pass::drhs, drhs_family, layer, options, nullptr);
  drhs.accumulate = grads.accumulate_dw;
  if (quantize_x) drhs.quantize_lhs = detail::quant_spec(*recipe.act, recipe.drhs_block_m);
  if (recipe.grad) drhs.quantize_rhs = detail::quant_spec(*recipe.grad, recipe.drhs_block_m);

  // Validate both calls before writing any output, including the instruction set a v2 call
  // resolves (Options::isa or GMM_ISA), which it checks only when it runs.
  if (run_dlhs) {
    make_gmm_problem(where, dlhs_lhs, dlhs_rhs, layer.group_sizes, grads.dx, dlhs);
    if (dlhs_family == Family::v2) kernels::resolve_isa("gmm::v2::gmm", dlhs.isa);
  }
  if (run_drhs) {
    make_tgmm_problem(where, layer.x, dy, layer.group_sizes, grads.dw, drhs);
    if (drhs_family == Family::v2) kernels::resolve_isa("gmm::v2::tgmm", drhs.isa);
  }

  PassTrace* dlhs_trace =
      run_dlhs ? detail::start_trace(options, Pass::dlhs, dlhs_family) : nullptr;
  PassTrace* drhs_trace =
      run_drhs ? detail::start_trace(options, Pass::drhs, drhs_family) : nullptr;
  if (options.trace != nullptr) {
    if (!run_dlhs) options.trace->passes[static_cast<int>(Pass::dlhs)].reset();
    if (!run_drhs) options.trace->passes[static_cast<int>(Pass::drhs)].reset();
  }
  if (run_dlhs) {
    if (fold) {
      const int threads = resolve_threads(options.threads);
      if (dy.dtype == DType::f32) {
        detail::fold_weight_scales(static_cast<const float*>(dy.data), dy.row_stride, w, rows,
                                   threads, folded.data());
      } else {
        detail::fold_weight_scales(static_cast<const bfloat16*>(dy.data), dy.row_stride, w, rows,
                                   threads, folded.data());
      }
    }
    if (dlhs_trace != nullptr) {
      dlhs.trace = &dlhs_trace->call;
      dlhs_trace->layer_bytes = static_cast<std::int64_t>(folded.size() * sizeof(float));
      if (fold) dlhs_trace->folded = "weight per-channel scales into dy";
    }
    gmm(dlhs_lhs, dlhs_rhs, layer.group_sizes, grads.dx, dlhs);
  }
  if (run_drhs) {
    if (drhs_trace != nullptr) drhs.trace = &drhs_trace->call;
    tgmm(layer.x, dy, layer.group_sizes, grads.dw, drhs);
  }
}

}  // namespace gmm
