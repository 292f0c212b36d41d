// gmm_bench: gmm's kernel families against per-group BLAS / oneDNN loops, on Google Benchmark.
//
//   gmm_bench [--quick | --full-size] [--threads=N] [--memory-gb=X]
//             [--openblas-coretype=NAME|default] [Google Benchmark flags, e.g.
//             --benchmark_filter=fwd/.*/bf16/ --benchmark_out=r.json --benchmark_out_format=json]
//
// Names are PASS/FAMILY/RECIPE/SHAPE (then /real_time). The default shapes are design.md's scaled
// to about 5 minutes (workload.hpp); --full-size runs them as designed; --quick runs two small
// shapes briefly (CI smoke, seconds).
// Threads default to 2 (or GMM_BENCH_THREADS). OpenBLAS runs with OPENBLAS_CORETYPE=SkylakeX
// unless the variable is already set: the binary re-executes itself with it, since OpenBLAS
// reads it when it loads.
#include <fmt/format.h>
#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "harness.hpp"

#ifdef GMM_BENCH_WITH_OPENBLAS
#include <cblas.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace gmm_bench {
namespace {

// Options of this binary (Google Benchmark's own flags are passed through).
struct CommandLine {
  ShapeSet shape_set = ShapeSet::scaled;
  int threads = 2;
  double memory_gb = 10;
  std::string openblas_coretype = "SkylakeX";
  std::vector<char*> benchmark_args;
};

bool take_value(std::string_view arg, std::string_view flag, std::string* value) {
  if (arg.substr(0, flag.size()) != flag) return false;
  *value = std::string(arg.substr(flag.size()));
  return true;
}

CommandLine parse(int argc, char** argv) {
  CommandLine cl;
  if (const char* env = std::getenv("GMM_BENCH_THREADS")) cl.threads = std::atoi(env);
  if (const char* env = std::getenv("GMM_BENCH_MEMORY_GB")) cl.memory_gb = std::atof(env);
  cl.benchmark_args.push_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    std::string value;
    if (arg == "--quick") {
      cl.shape_set = ShapeSet::quick;
    } else if (arg == "--full-size") {
      cl.shape_set = ShapeSet::full;
    } else if (take_value(arg, "--threads=", &value)) {
      cl.threads = std::atoi(value.c_str());
    } else if (take_value(arg, "--memory-gb=", &value)) {
      cl.memory_gb = std::atof(value.c_str());
    } else if (take_value(arg, "--openblas-coretype=", &value)) {
      cl.openblas_coretype = value;
    } else {
      cl.benchmark_args.push_back(argv[i]);
    }
  }
  if (cl.threads < 1) cl.threads = 1;
  return cl;
}

// Sets OPENBLAS_CORETYPE and restarts the process when it was not set (OpenBLAS reads it when
// the library loads, before main).
void select_openblas_core(const CommandLine& cl, char** argv) {
#ifdef GMM_BENCH_WITH_OPENBLAS
  if (cl.openblas_coretype == "default" || std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  setenv("OPENBLAS_CORETYPE", cl.openblas_coretype.c_str(), 1);
  execv("/proc/self/exe", argv);
  std::perror("gmm_bench: re-executing with OPENBLAS_CORETYPE failed");
#else
  (void)cl;
  (void)argv;
#endif
}

void set_library_threads([[maybe_unused]] int threads) {
  Eigen::setNbThreads(1);  // the Eigen baselines raise it around their own calls
#ifdef GMM_BENCH_WITH_OPENBLAS
  openblas_set_num_threads(threads);
#endif
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
}

// Records the build, the probed peaks and the baseline libraries in the run's context (printed
// by the console reporter and kept in the JSON output for bench/compare.py).
void add_context(const CommandLine& cl) {
  const Peaks& p = peaks();
  const auto add = [](const std::string& key, const std::string& value) {
    benchmark::AddCustomContext(key, value);
  };
  add("gmm_threads", std::to_string(cl.threads));
  add("gmm_shapes", std::string(name(cl.shape_set)));
  for (const Shape& shape : shapes(cl.shape_set)) add("shape_" + shape.name, describe(shape));
  add("gmm_compile_flags", GMM_BENCH_COMPILE_FLAGS);
  for (int t = 1; t <= 2; ++t) {
    add(fmt::format("peak_fp32_{}t", t), fmt::format("{:.1f} GFLOP/s", p.fp32_flops[t - 1] / 1e9));
    add(fmt::format("peak_bf16_{}t", t), fmt::format("{:.1f} GFLOP/s", p.bf16_flops[t - 1] / 1e9));
    add(fmt::format("peak_read_{}t", t), fmt::format("{:.1f} GB/s", p.read_bytes[t - 1] / 1e9));
    add(fmt::format("peak_write_{}t", t), fmt::format("{:.1f} GB/s", p.write_bytes[t - 1] / 1e9));
    add(fmt::format("peak_amx_bf16_{}t", t),
        fmt::format("{:.1f} GFLOP/s", p.amx_bf16_flops[t - 1] / 1e9));
  }
  add("peak_fp32_isa", p.fp32_isa.empty() ? "none" : p.fp32_isa);
  add("peak_bf16_isa", p.bf16_isa.empty() ? "none" : p.bf16_isa);
#ifdef _OPENMP
  constexpr const char* eigen_threads = "OpenMP threads";
#else
  constexpr const char* eigen_threads = "single-threaded (no OpenMP)";
#endif
  add("eigen", fmt::format("Eigen {}.{}.{}, {}", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION,
                           EIGEN_MINOR_VERSION, eigen_threads));
#ifdef GMM_BENCH_WITH_OPENBLAS
  add("openblas", openblas_description());
#else
  add("openblas", "skipped: " GMM_BENCH_OPENBLAS_MISSING);
#endif
#ifdef GMM_BENCH_WITH_ONEDNN
  add("onednn", onednn_description());
#else
  add("onednn", "skipped: " GMM_BENCH_ONEDNN_MISSING);
#endif
}

void register_all(ShapeSet set) {
  constexpr Recipe recipes[] = {Recipe::fp32, Recipe::bf16, Recipe::fp8, Recipe::fp8_block,
                                Recipe::fp8_static};
  for (const Shape& shape : shapes(set)) {
    for (const Recipe recipe : recipes) {
      for (const Pass pass : gmm::all_passes) {
        const Case c{pass, recipe, &shape};
        register_families(c);
        register_eigen_baselines(c);
#ifdef GMM_BENCH_WITH_OPENBLAS
        register_openblas_baselines(c);
#endif
#ifdef GMM_BENCH_WITH_ONEDNN
        register_onednn_baselines(c);
#endif
      }
    }
  }
}

}  // namespace
}  // namespace gmm_bench

int main(int argc, char** argv) {
  using namespace gmm_bench;
  CommandLine cl = parse(argc, argv);
  select_openblas_core(cl, argv);
  run_config().threads = cl.threads;
  run_config().shape_set = cl.shape_set;
  run_config().memory_budget_bytes = cl.memory_gb * 1e9;
  set_library_threads(cl.threads);
  const bool listing = std::any_of(argv, argv + argc, [](const char* arg) {
    return std::string_view(arg).find("--benchmark_list_tests") == 0;
  });
  const bool quick = cl.shape_set == ShapeSet::quick;
  if (!listing) peaks() = probe_peaks(quick);
  add_context(cl);
  register_probes(quick);
  register_all(cl.shape_set);

  const bool has_min_time = std::any_of(
      cl.benchmark_args.begin(), cl.benchmark_args.end(),
      [](const char* arg) { return std::string_view(arg).find("--benchmark_min_time") == 0; });
  std::string min_time = quick ? "--benchmark_min_time=0.01" : "--benchmark_min_time=0.2";
  if (!has_min_time) cl.benchmark_args.push_back(min_time.data());
  int bench_argc = static_cast<int>(cl.benchmark_args.size());
  cl.benchmark_args.push_back(nullptr);
  benchmark::Initialize(&bench_argc, cl.benchmark_args.data());
  if (benchmark::ReportUnrecognizedArguments(bench_argc, cl.benchmark_args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
