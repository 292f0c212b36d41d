// Google Benchmark glue shared by the gmm families and the baselines: peaks, counters, timing.
#pragma once

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>

#include "workload.hpp"

namespace gmm_bench {

// This machine's limits, probed at startup (probes.cpp), per thread count 1 and 2.
struct Peaks {
  double fp32_flops[2] = {0, 0};      // vfmadd231ps, flop/s
  double bf16_flops[2] = {0, 0};      // vdpbf16ps, flop/s (0 when the CPU has no AVX-512 BF16)
  double read_bytes[2] = {0, 0};      // streaming read of a large buffer, bytes/s
  double write_bytes[2] = {0, 0};     // non-temporal writes of a large buffer, bytes/s
  double amx_bf16_flops[2] = {0, 0};  // AMX tdpbf16ps, flop/s (0 without AMX)
  std::string fp32_isa, bf16_isa;
  // The compute peak a recipe is held to: fp32 FMA for fp32; for bf16 and fp8 (whose values are
  // exact in bf16 and may be multiplied by any engine) the fastest of AMX, the AVX-512 bf16 dot
  // product and fp32 FMA: this machine's limit for the recipe.
  double compute_peak(Recipe recipe, int threads) const;
  double read_peak(int threads) const;
  double write_peak(int threads) const;
};
Peaks& peaks();

// Measures the peaks (probes.cpp); `quick` uses shorter runs and a smaller buffer.
Peaks probe_peaks(bool quick);

// Registers the same probes as benchmarks, probe/KIND/DTYPE/1thread and 2threads (fma/fp32,
// dot/bf16 and amx/bf16 where the CPU has them, read/fp32, write/fp32; GFLOP or GB counters).
// Random interleaving spreads their repetitions over the run, so a cell's percentage of peak can
// be taken against the machine of the same minutes: a VM's speed can drift by 2x during a run.
void register_probes(bool quick);

// Wall time of the timed loop of one benchmark run.
struct LoopTime {
  double seconds = 0;
  std::int64_t iterations = 0;
};

// Sets the counters: GFLOP and weight_GB as rates (printed GFLOP=x/s, weight_GB=y/s), pct_peak
// (percent of the probed compute peak of the recipe), pct_bw (weight bytes per second as a
// percent of the probed read bandwidth for fwd and dlhs, which read the weights, and of the
// probed write bandwidth for drhs, which writes them), and extra_bytes (peak bytes allocated
// beyond the outputs). `weight_bytes`: bytes of the [G, K, N] operand per call (read by fwd and
// dlhs, written by drhs); `threads`: the call's, whose peaks the percentages are of.
void set_counters(benchmark::State& state, const Case& c, const Workload& w, const LoopTime& time,
                  double weight_bytes, std::int64_t extra_bytes, int threads);

// Bytes of the weights a call touches: the active experts' [K, N] blocks (and their scales).
double weight_bytes(const Case& c, const Workload& w, const Operand& weights);

// Runs `call` in the timed loop (after one untimed warm-up call when it is short); an exception
// is reported with SkipWithError, so unfinished kernels do not stop the run.
template <typename Call>
LoopTime time_calls(benchmark::State& state, const Workload& w, Call&& call) {
  constexpr double kWarmUpBelowFlops = 4e9;
  LoopTime time;
  try {
    if (case_flops(w) < kWarmUpBelowFlops) call();
    const auto start = std::chrono::steady_clock::now();
    for (auto _ : state) {
      call();
      benchmark::ClobberMemory();
    }
    time.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    time.iterations = static_cast<std::int64_t>(state.iterations());
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
  return time;
}

// Common settings of a registered benchmark: real (wall) time, in milliseconds. (The run length
// comes from --benchmark_min_time, which main sets unless given.)
benchmark::internal::Benchmark* configure(benchmark::internal::Benchmark* b);

// Registers the gmm families (v1, v2, hybrid, auto; v2-1thread on the thread-scaling cells) of a
// case (gmm_families.cpp).
void register_families(const Case& c);

// Baselines: each registers its benchmarks for a case, when it applies to the recipe.
void register_eigen_baselines(const Case& c);     // baseline-eigen, baseline-naive-fp8
void register_openblas_baselines(const Case& c);  // baseline-openblas (when found)
void register_onednn_baselines(const Case& c);    // baseline-onednn (when found)

// Baseline libraries' version and CPU path, for the run's context.
std::string openblas_description();
std::string onednn_description();

// Full benchmark name PASS/FAMILY/RECIPE/SHAPE.
std::string benchmark_name(const Case& c, std::string_view family);

}  // namespace gmm_bench
