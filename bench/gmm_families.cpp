// The gmm kernel families through the public API: v1, v2, and the hybrid and auto plans.
#include <fmt/format.h>

#include <optional>
#include <string>

#include "harness.hpp"

namespace gmm_bench {
namespace {

// A family column of the report: a fixed family or a plan that picks one per pass.
struct FamilyColumn {
  std::string name;
  gmm::Plan plan;
};

gmm::PassShape pass_shape(const Case& c, const Workload& w) {
  return {c.shape->groups, w.routed_rows(), c.shape->k, c.shape->n, is_fp8(c.recipe)};
}

std::string describe(const gmm::CallTrace& trace) {
  return fmt::format("{} {} tiles {}x{}x{}", gmm::name(trace.family), gmm::name(trace.isa),
                     trace.tiles.m, trace.tiles.k, trace.tiles.n);
}

void run_family(benchmark::State& state, const Case& c, const gmm::Plan& plan) {
  Workload& w = workload(*c.shape);
  gmm::CallTrace trace;
  gmm::Options options;
  options.family = plan.family(c.pass, pass_shape(c, w));
  options.threads = run_config().threads;
  options.trace = &trace;
  const gmm::DType in = input_dtype(c.recipe);
  const gmm::DType out = output_dtype(c.recipe);
  const Shape& s = *c.shape;
  try {
    OperandPtr touched;  // the [G, K, N] operand, for weight GB/s
    LoopTime time;
    if (c.pass == Pass::drhs) {
      const OperandPtr x = w.activations(in);
      const OperandPtr dy = w.output_gradient(in);
      const OperandPtr dw = w.output(c.pass, out);
      if (is_fp8(c.recipe)) {
        options.quantize_lhs = activation_quantization(c.recipe, s.m);
        options.quantize_rhs = activation_quantization(c.recipe, s.m);
      }
      time = time_calls(state, w, [&] {
        gmm::tgmm(x->matrix(), dy->matrix(), w.group_sizes(), dw->out_grouped(), options);
      });
      touched = dw;
    } else {
      const bool fwd = c.pass == Pass::fwd;
      const OperandPtr lhs = fwd ? w.activations(in) : w.output_gradient(in);
      const OperandPtr rhs =
          is_fp8(c.recipe) ? w.fp8_weights(weight_block(c.recipe, c.pass, s)) : w.weights(in);
      const OperandPtr result = w.output(c.pass, out);
      options.transpose_rhs = !fwd;
      if (is_fp8(c.recipe)) options.quantize_lhs = activation_quantization(c.recipe, lhs->cols);
      time = time_calls(state, w, [&] {
        gmm::gmm(lhs->matrix(), rhs->grouped(), w.group_sizes(), result->out(), options);
      });
      touched = rhs;
    }
    set_counters(state, c, w, time, weight_bytes(c, w, *touched), trace.extra_bytes);
    if (!trace.op.empty()) state.SetLabel(describe(trace));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

}  // namespace

void register_families(const Case& c) {
  static const FamilyColumn columns[] = {{"v1", gmm::Plan::v1()},
                                         {"v2", gmm::Plan::v2()},
                                         {"hybrid", gmm::Plan::hybrid()},
                                         {"auto", gmm::Plan::automatic()}};
  for (const FamilyColumn& column : columns) {
    const gmm::Plan plan = column.plan;
    configure(benchmark::RegisterBenchmark(
        benchmark_name(c, column.name).c_str(),
        [c, plan](benchmark::State& state) { run_family(state, c, plan); }));
  }
}

}  // namespace gmm_bench
