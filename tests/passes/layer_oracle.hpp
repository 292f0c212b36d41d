// fp64 oracle of an expert layer's three passes under a Recipe, and the trace a plan must show.
//
// layer_oracle(values, recipe) restates the recipe's math (gmm/recipe.hpp) with plain loops over
// doubles, independently of gmm/passes.hpp and of the kernels; only the element rules of
// core/qvalue.hpp (the contract every quantizer follows) are shared:
//   fwd   y  = Q_a(x) @ Q_w(w)       x blocks 1 x act_block_k (fixed: one static scale)
//   dlhs  dx = Q_g(dy') @ W'^T        per-channel weights: dy' = fp32(dy * s_w), W' = qvalues;
//                                     otherwise dy' = dy, W' = Q_w(w), dy blocks 1 x N block
//   drhs  dw = Q_a(x)^T @ Q_g(dy)     x and dy blocks drhs_block_m x 1
// With Recipe::none() it is the unquantized fp64 layer.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <utility>
#include <vector>

#include "gmm/core/qvalue.hpp"
#include "gmm/plan.hpp"
#include "gmm/recipe.hpp"
#include "gmm/ref/reference.hpp"
#include "gmm/trace.hpp"
#include "support/compare.hpp"
#include "support/operands.hpp"

namespace gmm {

// Readable gtest failure messages for the enums the layer tests compare.
inline void PrintTo(Family f, std::ostream* os) { *os << name(f); }
inline void PrintTo(Pass p, std::ostream* os) { *os << name(p); }
inline void PrintTo(DType d, std::ostream* os) { *os << name(d); }
inline void PrintTo(Isa i, std::ostream* os) { *os << name(i); }

}  // namespace gmm

namespace gmm::test {

// A layer's operands as the exact values their f32 / bf16 storage holds.
struct LayerValues {
  std::int64_t m = 0, k = 0, n = 0, groups = 0;
  std::vector<double> x, w, dy;     // [m, k], [groups, k, n], [m, n]
  std::vector<std::int32_t> sizes;  // all experts' group sizes
  std::int64_t group_offset = 0;

  // Local group owning row r, or -1.
  std::int64_t owner(std::int64_t r) const {
    std::int64_t begin = 0;
    for (std::int64_t j = 0; j < static_cast<std::int64_t>(sizes.size()); ++j) {
      const std::int64_t end = begin + sizes[j];
      if (r >= begin && r < end) {
        const std::int64_t g = j - group_offset;
        return g >= 0 && g < groups ? g : -1;
      }
      begin = end;
    }
    return -1;
  }
  std::int64_t group_size(std::int64_t g) const { return sizes[g + group_offset]; }
};

// The values of a layer's owned operands (x [m, k], w [groups, k, n], dy [m, n]).
inline LayerValues values_of(const OwnedMatrix& x, const OwnedMatrix& w, const OwnedMatrix& dy,
                             std::vector<std::int32_t> sizes, std::int64_t group_offset) {
  LayerValues v;
  v.m = x.rows;
  v.k = x.cols;
  v.n = w.cols;
  v.groups = w.groups;
  v.sizes = std::move(sizes);
  v.group_offset = group_offset;
  for (std::int64_t r = 0; r < v.m; ++r) {
    for (std::int64_t c = 0; c < v.k; ++c) v.x.push_back(x.stored(0, r, c));
    for (std::int64_t c = 0; c < v.n; ++c) v.dy.push_back(dy.stored(0, r, c));
  }
  for (std::int64_t g = 0; g < v.groups; ++g) {
    for (std::int64_t r = 0; r < v.k; ++r) {
      for (std::int64_t c = 0; c < v.n; ++c) v.w.push_back(w.stored(g, r, c));
    }
  }
  return v;
}

// The oracle of the three outputs (value, sum |a * b|, owned rows / groups).
struct LayerExact {
  ref::Exact y, dx, dw;
};

// A quantized [rows, cols] array: dequantized values, qvalues and each element's scale.
struct QuantizedValues {
  std::vector<double> dequantized, qvalue, scale;
};

// Qwix quantization of `a` [rows, cols] with blocks block_rows x block_cols (absmax), or one
// static per-tensor scale (fixed).
inline QuantizedValues quantize_values(const std::vector<double>& a, std::int64_t rows,
                                       std::int64_t cols, const QuantRule& rule,
                                       std::int64_t block_rows, std::int64_t block_cols) {
  const bool fixed = rule.calibration.method == Calibration::Method::fixed;
  QuantizedValues q{a, a, a};
  for (std::int64_t br = 0; br < rows; br += block_rows) {
    for (std::int64_t bc = 0; bc < cols; bc += block_cols) {
      float absmax = 0.0f;
      for (std::int64_t r = br; r < br + block_rows; ++r) {
        for (std::int64_t c = bc; c < bc + block_cols; ++c) {
          absmax = gmm::detail::absmax_update(absmax, static_cast<float>(a[r * cols + c]));
        }
      }
      const float scale = fixed ? rule.calibration.static_scale(rule.qtype)
                                : gmm::detail::absmax_scale(absmax, rule.qtype);
      for (std::int64_t r = br; r < br + block_rows; ++r) {
        for (std::int64_t c = bc; c < bc + block_cols; ++c) {
          const std::int64_t i = r * cols + c;
          const std::uint8_t stored =
              gmm::detail::quantize_value(static_cast<float>(a[i]), scale, rule.qtype);
          q.qvalue[i] = gmm::detail::dequantize_value(stored, rule.qtype);
          q.scale[i] = scale;
          q.dequantized[i] = q.qvalue[i] * scale;
        }
      }
    }
  }
  return q;
}

// Blocks along the second axis of extent `block` (0: whole axis; clamped to the axis).
inline std::int64_t whole_or(std::int64_t block, std::int64_t extent) {
  return block == 0 || block > extent ? extent : block;
}

// out[r, c] = sum over j < terms of term(r, g, c, j) for the rows r of local groups (g =
// owner[r] >= 0), with sum |term|; other rows are not written.
template <typename Term>
ref::Exact row_products(const std::vector<std::int64_t>& owner, std::int64_t cols,
                        std::int64_t terms, Term&& term) {
  const std::int64_t rows = static_cast<std::int64_t>(owner.size());
  ref::Exact e{std::vector<double>(rows * cols, 0.0), std::vector<double>(rows * cols, 0.0),
               std::vector<bool>(rows, false)};
  for (std::int64_t r = 0; r < rows; ++r) {
    if (owner[r] < 0) continue;
    e.written[r] = true;
    for (std::int64_t c = 0; c < cols; ++c) {
      double sum = 0.0, magnitude = 0.0;
      for (std::int64_t j = 0; j < terms; ++j) {
        const double t = term(r, owner[r], c, j);
        sum += t;
        magnitude += std::fabs(t);
      }
      e.value[r * cols + c] = sum;
      e.magnitude[r * cols + c] = magnitude;
    }
  }
  return e;
}

inline LayerExact layer_oracle(const LayerValues& v, const Recipe& recipe) {
  const std::int64_t m = v.m, k = v.k, n = v.n, groups = v.groups;
  std::vector<std::int64_t> owner(static_cast<std::size_t>(m));
  for (std::int64_t r = 0; r < m; ++r) owner[r] = v.owner(r);

  // Q_w(w), the weights as [groups * k, n] with the recipe's blocks.
  const BlockShape wb = recipe.weight_block(groups, k, n);
  QuantizedValues wq{v.w, v.w, std::vector<double>(v.w.size(), 1.0)};
  if (recipe.weight)
    wq = quantize_values(v.w, groups * k, n, *recipe.weight, wb.groups * wb.rows, wb.cols);

  // fwd
  std::vector<double> x = v.x;
  if (recipe.act) {
    const bool fixed = recipe.act->calibration.method == Calibration::Method::fixed;
    x = quantize_values(v.x, m, k, *recipe.act, fixed ? m : 1,
                        fixed ? k : whole_or(recipe.act_block_k, k))
            .dequantized;
  }
  LayerExact e;
  e.y = row_products(owner, n, k,
                     [&](std::int64_t r, std::int64_t g, std::int64_t c, std::int64_t i) {
                       return x[r * k + i] * wq.dequantized[(g * k + i) * n + c];
                     });

  // dlhs
  const bool per_channel = recipe.weight && n > 1 &&
                           (recipe.weight_scale == WeightScale::per_channel ||
                            recipe.weight_scale == WeightScale::per_channel_shared);
  std::vector<double> dy = v.dy;
  const std::vector<double>& wt = per_channel ? wq.qvalue : wq.dequantized;
  if (per_channel) {
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t c = 0; c < n; ++c) {
        const std::int64_t g = owner[r];
        dy[r * n + c] = g < 0 ? 0.0
                              : static_cast<double>(static_cast<float>(v.dy[r * n + c]) *
                                                    static_cast<float>(wq.scale[g * k * n + c]));
      }
    }
  }
  if (recipe.grad) {
    const std::int64_t block = recipe.weight && !per_channel ? wb.cols : n;
    dy = quantize_values(dy, m, n, *recipe.grad, 1, block).dequantized;
  }
  e.dx = row_products(owner, k, n,
                      [&](std::int64_t r, std::int64_t g, std::int64_t i, std::int64_t c) {
                        return dy[r * n + c] * wt[(g * k + i) * n + c];
                      });

  // drhs
  const std::int64_t block_m = whole_or(recipe.drhs_block_m, m);
  std::vector<double> xa = v.x, g_dy = v.dy;
  if (recipe.act) {
    const bool fixed = recipe.act->calibration.method == Calibration::Method::fixed;
    xa = quantize_values(v.x, m, k, *recipe.act, fixed ? m : block_m, fixed ? k : 1).dequantized;
  }
  if (recipe.grad) g_dy = quantize_values(v.dy, m, n, *recipe.grad, block_m, 1).dequantized;
  e.dw = {std::vector<double>(groups * k * n, 0.0), std::vector<double>(groups * k * n, 0.0),
          std::vector<bool>(groups, false)};
  for (std::int64_t r = 0; r < m; ++r) {
    const std::int64_t g = owner[r];
    if (g < 0) continue;
    e.dw.written[g] = true;
    for (std::int64_t i = 0; i < k; ++i) {
      for (std::int64_t c = 0; c < n; ++c) {
        const double t = xa[r * k + i] * g_dy[r * n + c];
        e.dw.value[(g * k + i) * n + c] += t;
        e.dw.magnitude[(g * k + i) * n + c] += std::fabs(t);
      }
    }
  }
  return e;
}

// The three outputs of a training step: y [m, n], dx [m, k], dw [groups, k, n].
struct LayerOutputs {
  OwnedOutput y, dx, dw;
};

// Outputs of dtype `d` holding `fill`, with padded rows (a write past a row shows).
inline LayerOutputs make_layer_outputs(const LayerValues& v, DType d, float fill) {
  return {make_output(d, 1, v.m, v.n, fill, 2), make_output(d, 1, v.m, v.k, fill, 1),
          make_output(d, v.groups, v.k, v.n, fill, 3)};
}

// Checks every element of the three outputs against the oracle (fp32 summation bound of
// support/compare.hpp), rows / groups no local group owns included (zeros, or untouched dw
// when accumulating), given the outputs' contents before the step.
inline ::testing::AssertionResult matches_oracle(const LayerExact& e, const LayerValues& v,
                                                 const LayerOutputs& before,
                                                 const LayerOutputs& got,
                                                 bool accumulate_dw = false) {
  auto rows = [](const ref::Exact& x) {
    return [&x](std::int64_t, std::int64_t r) { return static_cast<bool>(x.written[r]); };
  };
  ::testing::AssertionResult y = detail::check_output(e.y, before.y, got.y, false, rows(e.y),
                                                      [&](std::int64_t) { return v.k; });
  if (!y) return y << "\n(fwd: y)";
  ::testing::AssertionResult dx = detail::check_output(e.dx, before.dx, got.dx, false, rows(e.dx),
                                                       [&](std::int64_t) { return v.n; });
  if (!dx) return dx << "\n(dlhs: dx)";
  ::testing::AssertionResult dw = detail::check_output(
      e.dw, before.dw, got.dw, accumulate_dw,
      [&](std::int64_t g, std::int64_t) { return static_cast<bool>(e.dw.written[g]); },
      [&](std::int64_t g) { return v.group_size(g); });
  if (!dw) return dw << "\n(drhs: dw)";
  return ::testing::AssertionSuccess();
}

// An auto rule that picks v1 for fp32 fwd and dlhs with at most 128 rows per group (the default
// rule measured on an earlier machine; the current default never picks v1), with v1 allowed
// whatever Eigen was compiled for, so that both families take part in test builds without
// AVX-512 flags.
inline AutoThresholds auto_bounds_on_any_build() {
  AutoThresholds rule;
  rule.v1_max_rows_per_group[static_cast<int>(Pass::fwd)][static_cast<int>(Arithmetic::fp32)] = 128;
  rule.v1_max_rows_per_group[static_cast<int>(Pass::dlhs)][static_cast<int>(Arithmetic::fp32)] =
      128;
  rule.v1_min_isa = Isa::scalar;
  return rule;
}

// Checks that each pass ran on the family `plan` names for it (as the kernel itself reports:
// MaxText once let v2 silently overwrite v1's dlhs) and that every operand `recipe` quantizes
// entered the kernel quantized, with the recipe's qtype and scale block (MaxText once ran
// unquantized on an empty rule). x, w and dy are unquantized f32 / bf16 (`io`); `auto_rule` is
// the rule the passes ran auto choices with.
inline void expect_trace(const Trace& trace, const Plan& plan, const Recipe& recipe,
                         const LayerValues& v, DType io,
                         const AutoThresholds& auto_rule = auto_thresholds) {
  const std::int64_t m = v.m, k = v.k, n = v.n, groups = v.groups;
  std::int64_t owned = 0, owning = 0;
  for (std::int64_t g = 0; g < groups; ++g) {
    owned += v.group_size(g);
    owning += v.group_size(g) > 0 ? 1 : 0;
  }
  // An operand without a rule enters the call unquantized, as `plain`.
  auto expect_operand = [&](const OperandTrace& o, const std::optional<QuantRule>& rule,
                            DType plain, BlockShape block, Family family, bool in_call,
                            const char* what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(o.quantized, rule.has_value());
    if (!rule) {
      EXPECT_EQ(o.dtype, plain);
      EXPECT_EQ(o.quantized_by, "");
      return;
    }
    EXPECT_EQ(o.dtype, dtype_of(rule->qtype));
    EXPECT_EQ(o.block, block) << o.block.groups << "x" << o.block.rows << "x" << o.block.cols;
    EXPECT_EQ(o.quantized_by, !in_call               ? "caller"
                              : family == Family::v1 ? "outside kernel"
                                                     : "in kernel");
  };
  auto fixed = [](const std::optional<QuantRule>& r) {
    return r && r->calibration.method == Calibration::Method::fixed;
  };
  const bool per_channel = recipe.weight && n > 1 &&
                           (recipe.weight_scale == WeightScale::per_channel ||
                            recipe.weight_scale == WeightScale::per_channel_shared);
  // dy as dlhs multiplies it: with the weights' per-channel scales folded in, in f32.
  const DType dlhs_dy = per_channel ? DType::f32 : io;
  for (Pass pass : all_passes) {
    SCOPED_TRACE(name(pass));
    ASSERT_TRUE(trace.ran(pass));
    const PassTrace& t = trace.at(pass);
    EXPECT_EQ(t.pass, pass);
    // The family the kernel reports having run is the one the plan names for this pass. Its
    // arithmetic (gmm::Arithmetic) is fp32 when an operand enters the call as unquantized f32.
    const std::optional<QuantRule>& lhs_rule = pass == Pass::dlhs ? recipe.grad : recipe.act;
    const std::optional<QuantRule>& rhs_rule = pass == Pass::drhs ? recipe.grad : recipe.weight;
    const bool f32_lhs = !lhs_rule && (pass == Pass::dlhs ? dlhs_dy : io) == DType::f32;
    const bool f32_rhs = !rhs_rule && io == DType::f32;
    const Arithmetic arithmetic = f32_lhs || f32_rhs     ? Arithmetic::fp32
                                  : lhs_rule || rhs_rule ? Arithmetic::quantized
                                                         : Arithmetic::bf16;
    const Family expected = plan.family(pass, PassShape{owning, owned, arithmetic}, auto_rule);
    EXPECT_EQ(t.call.family, expected) << "plan " << plan.to_string();
    EXPECT_EQ(t.planned, expected);
    EXPECT_EQ(t.call.op, pass == Pass::drhs ? "tgmm" : "gmm");
    EXPECT_GE(t.call.threads, 1);
    const Family f = t.call.family;
    const BlockShape wb = recipe.weight_block(groups, k, n);
    const std::int64_t block_m = whole_or(recipe.drhs_block_m, m);
    if (pass == Pass::fwd) {
      expect_operand(t.call.lhs, recipe.act, io,
                     fixed(recipe.act) ? BlockShape{1, m, k}
                                       : BlockShape{1, 1, whole_or(recipe.act_block_k, k)},
                     f, true, "lhs x");
      expect_operand(t.call.rhs, recipe.weight, io, wb, f, false, "rhs w");
      EXPECT_EQ(t.folded, "");
    } else if (pass == Pass::dlhs) {
      expect_operand(t.call.lhs, recipe.grad, dlhs_dy,
                     BlockShape{1, 1, recipe.weight && !per_channel ? wb.cols : n}, f, true,
                     "lhs dy");
      expect_operand(t.call.rhs, recipe.weight, io, per_channel ? BlockShape{groups, k, n} : wb, f,
                     false, "rhs w");
      EXPECT_EQ(t.folded.empty(), !per_channel);
    } else {
      expect_operand(t.call.lhs, recipe.act, io,
                     fixed(recipe.act) ? BlockShape{1, m, k} : BlockShape{1, block_m, 1}, f, true,
                     "lhs x");
      expect_operand(t.call.rhs, recipe.grad, io, BlockShape{1, block_m, 1}, f, true, "rhs dy");
      EXPECT_EQ(t.folded, "");
    }
  }
}

}  // namespace gmm::test
