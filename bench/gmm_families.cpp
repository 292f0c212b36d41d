// The gmm kernel families through the public API: v1, v2, and the hybrid and auto plans.
#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "harness.hpp"

namespace gmm_bench {
namespace {

// A family column of the report: a fixed family or a plan that picks one per pass, on the run's
// threads or on one (the thread-scaling column).
struct FamilyColumn {
  std::string name;
  gmm::Plan plan;
  bool one_thread = false;
};

// What the auto plan sees of a call: the rows per group owning rows, and the operands as the
// call multiplies them.
gmm::PassShape pass_shape(const Workload& w, const PassOperands& ops, const gmm::Options& o) {
  std::int64_t owning = 0;
  for (std::int32_t size : w.group_sizes()) owning += size > 0 ? 1 : 0;
  return {owning, w.routed_rows(),
          gmm::arithmetic_of(ops.lhs->dtype, o.quantize_lhs.has_value(), ops.rhs->dtype,
                             o.quantize_rhs.has_value())};
}

std::string describe(const gmm::CallTrace& trace) {
  return fmt::format("{} {} tiles {}x{}x{}", gmm::name(trace.family), gmm::name(trace.isa),
                     trace.tiles.m, trace.tiles.k, trace.tiles.n);
}

void run_family(benchmark::State& state, const Case& c, const gmm::Plan& plan, int threads) {
  Workload& w = workload(*c.shape);
  gmm::CallTrace trace;
  gmm::Options options;
  options.threads = threads;
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
      options.family = plan.family(c.pass, pass_shape(w, ops, options));
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
      options.family = plan.family(c.pass, pass_shape(w, ops, options));
      time = time_calls(state, w, [&] {
        gmm::gmm(ops.lhs->matrix(), ops.rhs->grouped(), w.group_sizes(), ops.out->out(), options);
      });
    }
    set_counters(state, c, w, time, weight_bytes(c, w, ops.weight_like(c.pass)), trace.extra_bytes,
                 threads);
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
                                         {"auto", gmm::Plan::automatic()},
                                         {"v2-1thread", gmm::Plan::v2(), true}};
  // The cells of issue 4's thread-scaling target (v2 fwd and drhs, fp32 and fp8) also run on one
  // thread, interleaved with the others, so that their ratio comes from one run.
  const bool scaling_cell = run_config().threads > 1 && c.pass != Pass::dlhs &&
                            (c.recipe == Recipe::fp32 || c.recipe == Recipe::fp8);
  for (const FamilyColumn& column : columns) {
    if (column.one_thread && !scaling_cell) continue;
    const gmm::Plan plan = column.plan;
    const int threads = column.one_thread ? 1 : run_config().threads;
    configure(benchmark::RegisterBenchmark(
        benchmark_name(c, column.name).c_str(),
        [c, plan, threads](benchmark::State& state) { run_family(state, c, plan, threads); }));
  }
}

}  // namespace gmm_bench
