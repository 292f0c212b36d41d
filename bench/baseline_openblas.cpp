// Baseline: a per-group loop of OpenBLAS sgemm (fp32).
#include <cblas.h>

#include <cstring>
#include <string>
#include <thread>

#include "harness.hpp"

namespace gmm_bench {
namespace {

// fwd out_g = x_g w_g; dlhs out_g = dy_g w_g^T; drhs out_g = x_g^T dy_g.
void sgemm_grouped(Pass pass, const Workload& w, const float* lhs, const float* rhs, float* out) {
  const int k = static_cast<int>(w.shape().k), n = static_cast<int>(w.shape().n);
  const std::int64_t block = static_cast<std::int64_t>(k) * n;
  for (std::int64_t g = 0; g < w.shape().groups; ++g) {
    const int rows = w.group_sizes()[g];
    const std::int64_t first = w.group_offsets()[g];
    if (pass == Pass::drhs) {
      if (rows == 0) {
        std::memset(out + g * block, 0, sizeof(float) * block);
      } else {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, n, rows, 1.0f, lhs + first * k, k,
                    rhs + first * n, n, 0.0f, out + g * block, n);
      }
    } else if (rows > 0 && pass == Pass::fwd) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, n, k, 1.0f, lhs + first * k, k,
                  rhs + g * block, n, 0.0f, out + first * n, n);
    } else if (rows > 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, k, n, 1.0f, lhs + first * n, n,
                  rhs + g * block, n, 0.0f, out + first * k, k);
    }
  }
}

void run_openblas(benchmark::State& state, const Case& c) {
  Workload& w = workload(*c.shape);
  const PassOperands ops = w.operands(c.pass, gmm::DType::f32);
  const LoopTime time = time_calls(state, w, [&] {
    sgemm_grouped(c.pass, w, ops.lhs->as<float>(), ops.rhs->as<float>(), ops.out->as<float>());
  });
  set_counters(state, c, w, time, weight_bytes(c, w, ops.weight_like(c.pass)), 0,
               run_config().threads);
  // OpenBLAS workers spin for a while after a call; let them sleep before the next benchmark.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

}  // namespace

void register_openblas_baselines(const Case& c) {
  if (c.recipe != Recipe::fp32) return;
  configure(benchmark::RegisterBenchmark(benchmark_name(c, "baseline-openblas").c_str(),
                                         [c](benchmark::State& state) { run_openblas(state, c); }));
}

std::string openblas_description() {
  return std::string("OpenBLAS ") + openblas_get_config() + ", core " + openblas_get_corename() +
         ", " + std::to_string(openblas_get_num_threads()) + " threads";
}

}  // namespace gmm_bench
