// Recipes: which operands of an expert layer's three passes are quantized, and how (Qwix QtRule).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gmm/core/calibration.hpp"
#include "gmm/core/dtype.hpp"
#include "gmm/core/error.hpp"
#include "gmm/core/view.hpp"

namespace gmm {

// Layout of the weight scales over w [G, K, N]: per_tensor (one scale, required by a fixed
// calibration), per_channel (one per expert and output column), per_channel_shared (one per
// output column for all experts: Qwix's and MaxText's), blockwise (one per weight_block_k x
// weight_block_n tile of each expert: DeepSeek-V3's 128 x 128). All but blockwise span all of K.
enum class WeightScale : std::uint8_t { per_tensor, per_channel, per_channel_shared, blockwise };

constexpr std::string_view name(WeightScale s) {
  switch (s) {
    case WeightScale::per_tensor:
      return "per_tensor";
    case WeightScale::per_channel:
      return "per_channel";
    case WeightScale::per_channel_shared:
      return "per_channel_shared";
    case WeightScale::blockwise:
      return "blockwise";
  }
  return "?";
}

// How one operand is quantized: its storage type and how its scales are calibrated.
struct QuantRule {
  QType qtype = QType::float8_e4m3fn;
  Calibration calibration;

  friend bool operator==(const QuantRule& a, const QuantRule& b) {
    return a.qtype == b.qtype && a.calibration.method == b.calibration.method &&
           a.calibration.bound == b.calibration.bound;
  }
  friend bool operator!=(const QuantRule& a, const QuantRule& b) { return !(a == b); }
};

// The quantization recipe of an expert layer y = x @ W_g for training (Qwix's QtRule with
// weight_qtype, act_qtype and bwd_qtype). With Q_w, Q_a, Q_g the quantize-dequantize maps of
// the weight, activation and gradient rules (a missing rule is the identity), the passes compute
// the straight-through estimator:
//   fwd   y  = Q_a(x) @ Q_w(w)      x scaled per (row, act_block_k block of K); w per weight_scale
//   dlhs  dx = Q_g(dy) @ Q_w(w)^T   dy scaled per row (per (row, N block) for blockwise weights)
//   drhs  dw = Q_a(x)^T @ Q_g(dy)   x and dy scaled per (drhs_block_m block of M, column)
// Each pass keeps the scales of its kept axes outside its contraction. dlhs contracts N, along
// which per-channel weight scales vary: as Qwix does, the weight's per-N scale is folded into dy
// (dy * s_w in fp32) before dy is quantized, and the weight's qvalues enter the product with a
// unit scale; blockwise weights keep their N blocks and dy is quantized 1 x weight_block_n.
// drhs contracts M: x and dy are quantized in the tgmm call with blocks along M (DeepSeek-V3's
// 128 x 1 tiles for the weight gradient; whole M gives Qwix's per-column gradient scales).
// Folding x's forward per-row scale into dy instead, as Qwix does, works only when x's scale is
// constant along K, which 1 x 128 activation blocks are not. Both families receive the same
// operands and quantize with the same element rules, so they compute the same quantized values.
struct Recipe {
  std::optional<QuantRule> weight;
  std::optional<QuantRule> act;
  std::optional<QuantRule> grad;
  WeightScale weight_scale = WeightScale::per_channel_shared;
  std::int64_t weight_block_k = 128;  // blockwise only
  std::int64_t weight_block_n = 128;  // blockwise only
  std::int64_t act_block_k = 0;       // fwd activation scale block along K; 0: whole K (per row)
  std::int64_t drhs_block_m = 0;      // drhs scale block along M; 0: whole M (per column)

  // No quantization: fp32 math on f32 / bf16 operands.
  static Recipe none() { return {}; }

  // MaxText's fp8_full: e4m3fn weights (per channel, shared across experts) and activations (per
  // row), e5m2 gradients (per row for dlhs, per column for drhs), all absmax.
  static Recipe fp8_full() {
    Recipe r;
    r.weight = QuantRule{QType::float8_e4m3fn, Calibration::absmax()};
    r.act = QuantRule{QType::float8_e4m3fn, Calibration::absmax()};
    r.grad = QuantRule{QType::float8_e5m2, Calibration::absmax()};
    return r;
  }

  // fp8_full with a static per-tensor activation scale max / 448 (Qwix "fixed,MAX"), known
  // before the data is seen.
  static Recipe fp8_static(float max) {
    Recipe r = fp8_full();
    r.act->calibration = Calibration::fixed(max);
    return r;
  }

  // DeepSeek-V3's block-wise fp8: 128 x 128 weight blocks, 1 x 128 activation blocks, 128 x 1
  // blocks for the weight gradient, and e4m3fn for every tensor (fine-grained scales make
  // e5m2's range unnecessary for gradients).
  static Recipe fp8_blockwise() {
    Recipe r;
    r.weight = QuantRule{QType::float8_e4m3fn, Calibration::absmax()};
    r.act = QuantRule{QType::float8_e4m3fn, Calibration::absmax()};
    r.grad = QuantRule{QType::float8_e4m3fn, Calibration::absmax()};
    r.weight_scale = WeightScale::blockwise;
    r.act_block_k = 128;
    r.drhs_block_m = 128;
    return r;
  }

  // Parses a preset name: "none", "fp8_full", "fp8_blockwise" or "fp8_static(MAX)".
  static Recipe parse(std::string_view text) {
    if (text == "none") return none();
    if (text == "fp8_full") return fp8_full();
    if (text == "fp8_blockwise") return fp8_blockwise();
    constexpr std::string_view stat = "fp8_static(";
    if (text.size() > stat.size() + 1 && text.substr(0, stat.size()) == stat &&
        text.back() == ')') {
      const std::string_view bound = text.substr(stat.size(), text.size() - stat.size() - 1);
      return fp8_static(Calibration::parse(fmt::format("fixed,{}", bound)).bound);
    }
    detail::fail("gmm::Recipe::parse", "recipe",
                 "\"none\", \"fp8_full\", \"fp8_blockwise\" or \"fp8_static(MAX)\"",
                 fmt::format("\"{}\"", text));
  }

  bool quantizes() const { return weight || act || grad; }

  // Scale block of the weights [groups, k, n] (meaningful when `weight` is set).
  BlockShape weight_block(std::int64_t groups, std::int64_t k, std::int64_t n) const {
    switch (weight_scale) {
      case WeightScale::per_tensor:
        return {groups, k, n};
      case WeightScale::per_channel:
        return {1, k, 1};
      case WeightScale::per_channel_shared:
        return {groups, k, 1};
      case WeightScale::blockwise:
        return {1, weight_block_k, weight_block_n};
    }
    return {};
  }

  // Throws gmm::Error for combinations that cannot be honoured, whatever the shapes.
  void validate() const {
    constexpr const char* where = "gmm::Recipe";
    using detail::require;
    const bool fixed_weight = weight && weight->calibration.method == Calibration::Method::fixed;
    require(!fixed_weight || weight_scale == WeightScale::per_tensor, where,
            "weight_scale with fixed weight calibration",
            "per_tensor (a fixed calibration is one static scale per tensor)", name(weight_scale));
    require(weight_scale != WeightScale::blockwise || (weight_block_k >= 1 && weight_block_n >= 1),
            where, "weight_block_k x weight_block_n", "positive extents",
            fmt::format("{} x {}", weight_block_k, weight_block_n));
    const bool fixed_act = act && act->calibration.method == Calibration::Method::fixed;
    require(act_block_k >= 0, where, "act_block_k", ">= 0 (0: whole K)", act_block_k);
    require(!fixed_act || act_block_k == 0, where, "act_block_k with fixed act calibration",
            "0 (a fixed calibration is one static scale per tensor)", act_block_k);
    require(drhs_block_m >= 0, where, "drhs_block_m", ">= 0 (0: whole M)", drhs_block_m);
    require(!grad || grad->calibration.method == Calibration::Method::absmax, where,
            "grad calibration",
            "absmax (gradients have no range known in advance, and dlhs folds the weight scales "
            "into them)",
            grad ? grad->calibration.to_string() : std::string());
    if (fixed_weight) weight->calibration.static_scale(weight->qtype);
    if (fixed_act) act->calibration.static_scale(act->qtype);
  }

  // The preset name when the recipe is a preset, else describe().
  std::string to_string() const {
    if (*this == none()) return "none";
    if (*this == fp8_full()) return "fp8_full";
    if (*this == fp8_blockwise()) return "fp8_blockwise";
    if (act && act->calibration.method == Calibration::Method::fixed &&
        *this == fp8_static(act->calibration.bound)) {
      return fmt::format("fp8_static({})", act->calibration.bound);
    }
    return describe();
  }

  // Every field, e.g. "weight float8_e4m3fn absmax per_channel_shared; act float8_e4m3fn absmax
  // per row; grad float8_e5m2 absmax; drhs blocks whole M".
  std::string describe() const {
    auto rule = [](const std::optional<QuantRule>& r) {
      return r ? fmt::format("{} {}", r->qtype, r->calibration.to_string())
               : std::string("unquantized");
    };
    const std::string weight_layout =
        weight_scale == WeightScale::blockwise
            ? fmt::format("blockwise {}x{}", weight_block_k, weight_block_n)
            : std::string(name(weight_scale));
    return fmt::format(
        "weight {}{}; act {}{}; grad {}; drhs blocks {}", rule(weight),
        weight ? " " + weight_layout : std::string(), rule(act),
        act ? (act_block_k == 0 ? std::string(" per row") : fmt::format(" 1x{}", act_block_k))
            : std::string(),
        rule(grad), drhs_block_m == 0 ? std::string("whole M") : fmt::format("{}x1", drhs_block_m));
  }

  friend bool operator==(const Recipe& a, const Recipe& b) {
    return a.weight == b.weight && a.act == b.act && a.grad == b.grad &&
           a.weight_scale == b.weight_scale && a.weight_block_k == b.weight_block_k &&
           a.weight_block_n == b.weight_block_n && a.act_block_k == b.act_block_k &&
           a.drhs_block_m == b.drhs_block_m;
  }
  friend bool operator!=(const Recipe& a, const Recipe& b) { return !(a == b); }
};

}  // namespace gmm

template <>
struct fmt::formatter<gmm::Recipe> : fmt::formatter<std::string_view> {
  auto format(const gmm::Recipe& recipe, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(recipe.to_string(), ctx);
  }
};
