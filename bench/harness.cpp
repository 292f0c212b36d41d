// Counters and names shared by every benchmark.
#include "harness.hpp"

#include <algorithm>

namespace gmm_bench {

Peaks& peaks() {
  static Peaks instance;
  return instance;
}

namespace {

// Value of a per-thread-count probe for `threads` (beyond two, scaled from the two-thread one).
double for_threads(const double (&probe)[2], int threads) {
  if (threads <= 2) return probe[std::max(threads, 1) - 1];
  return probe[1] * threads / 2.0;
}

}  // namespace

double Peaks::compute_peak(Recipe recipe, int threads) const {
  const double fp32 = for_threads(fp32_flops, threads);
  if (recipe == Recipe::fp32) return fp32;
  return std::max({fp32, for_threads(bf16_flops, threads), for_threads(amx_bf16_flops, threads)});
}

double Peaks::read_peak(int threads) const { return for_threads(read_bytes, threads); }

double Peaks::write_peak(int threads) const { return for_threads(write_bytes, threads); }

double weight_bytes(const Case& c, const Workload& w, const Operand& weights) {
  const double per_group = static_cast<double>(weights.rows * weights.cols) *
                           static_cast<double>(gmm::size_of(weights.dtype));
  if (c.pass == Pass::drhs) return per_group * static_cast<double>(weights.groups);
  double scale_bytes = 0;
  if (weights.scales != nullptr) {
    scale_bytes = 4.0 * static_cast<double>(weights.rows / weights.block.rows) *
                  static_cast<double>(weights.cols / weights.block.cols);
  }
  return (per_group + scale_bytes) * static_cast<double>(w.active_groups());
}

void set_counters(benchmark::State& state, const Case& c, const Workload& w, const LoopTime& time,
                  double weight_bytes, std::int64_t extra_bytes, int threads) {
  using benchmark::Counter;
  if (time.iterations == 0 || time.seconds <= 0) return;
  const double flops = case_flops(w);
  const double calls_per_second = static_cast<double>(time.iterations) / time.seconds;
  const double compute_peak = peaks().compute_peak(c.recipe, threads);
  const double bandwidth =
      c.pass == Pass::drhs ? peaks().write_peak(threads) : peaks().read_peak(threads);
  state.counters["GFLOP"] = Counter(flops / 1e9, Counter::kIsIterationInvariantRate);
  state.counters["weight_GB"] = Counter(weight_bytes / 1e9, Counter::kIsIterationInvariantRate);
  if (compute_peak > 0) state.counters["pct_peak"] = 100 * flops * calls_per_second / compute_peak;
  if (bandwidth > 0) state.counters["pct_bw"] = 100 * weight_bytes * calls_per_second / bandwidth;
  state.counters["extra_bytes"] = static_cast<double>(extra_bytes);
}

benchmark::internal::Benchmark* configure(benchmark::internal::Benchmark* b) {
  return b->UseRealTime()->Unit(benchmark::kMillisecond);
}

std::string benchmark_name(const Case& c, std::string_view family) {
  std::string s(name(c.pass));
  s += '/';
  s += family;
  s += '/';
  s += name(c.recipe);
  s += '/';
  s += c.shape->name;
  return s;
}

}  // namespace gmm_bench
