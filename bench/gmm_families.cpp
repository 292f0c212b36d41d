// The gmm kernel families through the public API: v1, v2, and the hybrid and auto plans.
#include <fmt/format.h>

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
  const Shape& s = *c.shape;
  try {
    PassOperands ops = w.operands(c.pass, dense_dtype(c.recipe));
    LoopTime time;
    if (c.pass == Pass::drhs) {
      if (is_fp8(c.recipe)) {
        options.quantize_lhs = activation_quantization(c.recipe, s.m);
        options.quantize_rhs = activation_quantization(c.recipe, s.m);
      }
      time = time_calls(state, w, [&] {
        gmm::tgmm(ops.lhs->matrix(), ops.rhs->matrix(), w.group_sizes(), ops.out->out_grouped(),
                  options);
      });
    } else {
      if (is_fp8(c.recipe)) {
        ops.rhs = w.fp8_weights(weight_block(c.recipe, c.pass, s));
        options.quantize_lhs = activation_quantization(c.recipe, ops.lhs->cols);
      }
      options.transpose_rhs = c.pass == Pass::dlhs;
      time = time_calls(state, w, [&] {
        gmm::gmm(ops.lhs->matrix(), ops.rhs->grouped(), w.group_sizes(), ops.out->out(), options);
      });
    }
    set_counters(state, c, w, time, weight_bytes(c, w, ops.weight_like(c.pass)), trace.extra_bytes);
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
