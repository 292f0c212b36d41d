// Probes of this machine's limits: fp32 FMA and bf16 dot-product peaks, memory read and write
// bandwidth.
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"

namespace gmm_bench {
namespace {

constexpr int kChains = 16;  // independent accumulators: enough to cover FMA latency x ports

// Each function runs `rounds` rounds of kChains independent multiply-adds and returns a sum, so
// the work cannot be dropped. Returns the flops done through `flops`.
// Sum of the lanes (GCC 12's _mm512_reduce_add_ps trips -Wmaybe-uninitialized).
__attribute__((target("avx512f"))) float lane_sum(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float sum = 0;
  for (float x : lanes) sum += x;
  return sum;
}

__attribute__((target("avx512f"))) float fma_avx512(std::int64_t rounds, double* flops) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
  for (std::int64_t r = 0; r < rounds; ++r) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  *flops = static_cast<double>(rounds) * kChains * 16 * 2;
  return lane_sum(sum);
}

__attribute__((target("avx2,fma"))) float fma_avx2(std::int64_t rounds, double* flops) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
  for (std::int64_t r = 0; r < rounds; ++r) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  float lanes[8];
  _mm256_storeu_ps(lanes, sum);
  *flops = static_cast<double>(rounds) * kChains * 8 * 2;
  return lanes[0] + lanes[7];
}

// vdpbf16ps: 16 lanes x 2 bf16 pairs x (multiply + add) = 64 flops per instruction.
__attribute__((target("avx512f,avx512bf16"))) float dot_bf16_avx512(std::int64_t rounds,
                                                                    double* flops) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(-1e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  for (std::int64_t r = 0; r < rounds; ++r) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  *flops = static_cast<double>(rounds) * kChains * 16 * 4;
  return lane_sum(sum);
}

// Tile configuration (palette 1): tmm0-3 fp32 accumulators 16x16, tmm4-5 bf16 A 16x32, tmm6-7
// bf16 B 16x32 (pairs), every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

bool cpu_has_amx_bf16() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (d & (1u << 22)) && (d & (1u << 24));  // AMX-BF16, AMX-TILE
}

// Linux gives a process AMX tile state only when asked (ARCH_REQ_XCOMP_PERM, XTILEDATA).
bool request_amx() {
  constexpr int kArchRequestPermission = 0x1023, kXtileData = 18;
  return syscall(SYS_arch_prctl, kArchRequestPermission, kXtileData) == 0;
}

// tdpbf16ps: a 16x16 fp32 tile += 16x32 bf16 times 32x16 bf16 = 16384 flops per instruction.
__attribute__((target("amx-tile,amx-bf16"))) float dot_bf16_amx(std::int64_t rounds,
                                                                double* flops) {
  const TileConfig config;
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  for (std::int64_t r = 0; r < rounds; ++r) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  *flops = static_cast<double>(rounds) * 4 * 16384;
  return out[0];
}

__attribute__((target("avx512f"))) float read_avx512(const float* data, std::int64_t count) {
  __m512 acc[8];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (std::int64_t i = 0; i + 128 <= count; i += 128) {
    for (int c = 0; c < 8; ++c) acc[c] = _mm512_add_ps(acc[c], _mm512_load_ps(data + i + 16 * c));
  }
  for (int c = 1; c < 8; ++c) acc[0] = _mm512_add_ps(acc[0], acc[c]);
  return lane_sum(acc[0]);
}

__attribute__((target("avx2"))) float read_avx2(const float* data, std::int64_t count) {
  __m256 acc[8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (std::int64_t i = 0; i + 64 <= count; i += 64) {
    for (int c = 0; c < 8; ++c) acc[c] = _mm256_add_ps(acc[c], _mm256_load_ps(data + i + 8 * c));
  }
  for (int c = 1; c < 8; ++c) acc[0] = _mm256_add_ps(acc[0], acc[c]);
  float lanes[8];
  _mm256_storeu_ps(lanes, acc[0]);
  return lanes[0] + lanes[7];
}

float read_scalar(const float* data, std::int64_t count) {
  float sum = 0;
  for (std::int64_t i = 0; i < count; i += 16) sum += data[i];
  return sum;
}

// Streaming writes with non-temporal stores (each line written without being read first), as
// gmm writes outputs of 32 MiB or more.
__attribute__((target("avx512f"))) void write_avx512(float* data, std::int64_t count) {
  const __m512 value = _mm512_set1_ps(1.0f);
  for (std::int64_t i = 0; i + 64 <= count; i += 64) {
    for (int c = 0; c < 4; ++c) _mm512_stream_ps(data + i + 16 * c, value);
  }
  _mm_sfence();
}

__attribute__((target("avx2"))) void write_avx2(float* data, std::int64_t count) {
  const __m256 value = _mm256_set1_ps(1.0f);
  for (std::int64_t i = 0; i + 32 <= count; i += 32) {
    for (int c = 0; c < 4; ++c) _mm256_stream_ps(data + i + 8 * c, value);
  }
  _mm_sfence();
}

void write_scalar(float* data, std::int64_t count) { std::fill(data, data + count, 1.0f); }

using Clock = std::chrono::steady_clock;

// Runs work(thread) on `threads` threads started together; returns the wall time in seconds.
template <typename Work>
double run_on_threads(int threads, Work&& work) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load()) {
      }
      work(t);
    });
  }
  while (ready.load() < threads) {
  }
  const auto start = Clock::now();
  go.store(true);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

volatile float g_sink;

// Work done by one run of a probe (flops or bytes) and its wall time.
struct ProbeRun {
  double work = 0;
  double seconds = 0;
  double rate() const { return seconds > 0 ? work / seconds : 0; }
};

// One run of a compute kernel on `threads` threads.
template <typename Kernel>
ProbeRun compute_run(Kernel kernel, int threads, std::int64_t rounds) {
  std::vector<double> flops(threads);
  ProbeRun run;
  run.seconds = run_on_threads(threads, [&](int t) { g_sink = kernel(rounds, &flops[t]); });
  for (double f : flops) run.work += f;
  return run;
}

// Best of `repeats` runs of a compute kernel on `threads` threads, in flop/s.
template <typename Kernel>
double compute_peak(Kernel kernel, int threads, std::int64_t rounds, int repeats) {
  double best = 0;
  for (int r = 0; r < repeats; ++r)
    best = std::max(best, compute_run(kernel, threads, rounds).rate());
  return best;
}

bool has_avx512() { return __builtin_cpu_supports("avx512f"); }
bool has_avx2_fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
bool has_bf16_dot() { return has_avx512() && __builtin_cpu_supports("avx512bf16"); }
bool has_amx_bf16() { return cpu_has_amx_bf16() && request_amx(); }

// One streaming read of `count` floats, split among `threads` threads.
ProbeRun read_run(const float* buffer, std::int64_t count, int threads) {
  const std::int64_t share = count / threads;
  const double seconds = run_on_threads(threads, [&](int t) {
    const float* start = buffer + t * share;
    g_sink = has_avx512()     ? read_avx512(start, share)
             : has_avx2_fma() ? read_avx2(start, share)
                              : read_scalar(start, share);
  });
  return {static_cast<double>(count) * sizeof(float), seconds};
}

// One non-temporal write of `count` floats, split among `threads` threads.
ProbeRun write_run(float* buffer, std::int64_t count, int threads) {
  const std::int64_t share = count / threads;
  const double seconds = run_on_threads(threads, [&](int t) {
    float* start = buffer + t * share;
    if (has_avx512()) {
      write_avx512(start, share);
    } else if (has_avx2_fma()) {
      write_avx2(start, share);
    } else {
      write_scalar(start, share);
    }
  });
  return {static_cast<double>(count) * sizeof(float), seconds};
}

// Floats in the bandwidth probes' buffer: 1 GiB (256 MiB for --quick), far beyond the caches.
std::int64_t probe_buffer_floats(bool quick) {
  return (quick ? std::int64_t{64} : std::int64_t{256}) << 20;
}

// The bandwidth probes' buffer, every page written once; throws std::bad_alloc when it cannot be
// had.
struct ProbeBuffer {
  explicit ProbeBuffer(std::int64_t floats)
      : count(floats),
        data(static_cast<float*>(std::aligned_alloc(64, floats * sizeof(float))), &std::free) {
    if (data == nullptr) throw std::bad_alloc();
    for (std::int64_t i = 0; i < count; ++i) data.get()[i] = static_cast<float>(i & 1023);
  }
  std::int64_t count;
  std::unique_ptr<float, decltype(&std::free)> data;
};

std::int64_t compute_rounds(bool quick) { return quick ? 2'000'000 : 20'000'000; }

// A probe as a benchmark: make_probe() sets it up untimed (the bandwidth probes' buffer) and
// returns the probe; each iteration is one run of it, and the counter (GFLOP or GB) its work over
// the loop's wall time.
template <typename MakeProbe>
void register_probe(const std::string& name, const char* counter, MakeProbe make_probe) {
  configure(benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& state) {
    try {
      auto probe = make_probe();
      double work = 0;
      for (auto _ : state) work += probe().work;
      state.counters[counter] = benchmark::Counter(work / 1e9, benchmark::Counter::kIsRate);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
    }
  }));
}

// A compute probe's make_probe.
template <typename Kernel>
auto compute_probe(Kernel kernel, int threads, std::int64_t rounds) {
  return [=] { return [=] { return compute_run(kernel, threads, rounds); }; };
}

std::string thread_suffix(int threads) { return threads == 1 ? "1thread" : "2threads"; }

}  // namespace

Peaks probe_peaks(bool quick) {
  Peaks p;
  const bool bf16 = has_bf16_dot();
  const bool amx = has_amx_bf16();
  const std::int64_t rounds = compute_rounds(quick);
  const int repeats = quick ? 1 : 3;
  for (int t = 1; t <= 2; ++t) {
    if (has_avx512()) {
      p.fp32_flops[t - 1] = compute_peak(fma_avx512, t, rounds, repeats);
      p.fp32_isa = "avx512f vfmadd231ps";
    } else if (has_avx2_fma()) {
      p.fp32_flops[t - 1] = compute_peak(fma_avx2, t, rounds, repeats);
      p.fp32_isa = "avx2 vfmadd231ps";
    }
    if (bf16) {
      p.bf16_flops[t - 1] = compute_peak(dot_bf16_avx512, t, rounds, repeats);
      p.bf16_isa = "avx512bf16 vdpbf16ps";
    }
    if (amx) p.amx_bf16_flops[t - 1] = compute_peak(dot_bf16_amx, t, rounds / 8, repeats);
  }

  try {
    ProbeBuffer buffer(probe_buffer_floats(quick));
    // Best of repeats + 1 passes over the buffer, in bytes/s.
    for (int t = 1; t <= 2; ++t) {
      for (int r = 0; r < repeats + 1; ++r) {
        p.read_bytes[t - 1] =
            std::max(p.read_bytes[t - 1], read_run(buffer.data.get(), buffer.count, t).rate());
        p.write_bytes[t - 1] =
            std::max(p.write_bytes[t - 1], write_run(buffer.data.get(), buffer.count, t).rate());
      }
    }
  } catch (const std::bad_alloc& e) {
    std::fprintf(stderr, "gmm_bench: no bandwidth probes (%s): pct_bw is left out\n", e.what());
  }
  return p;
}

void register_probes(bool quick) {
  const std::int64_t rounds = compute_rounds(quick);
  const std::int64_t floats = probe_buffer_floats(quick);
  for (int t = 1; t <= 2; ++t) {
    const std::string threads = thread_suffix(t);
    if (has_avx512()) {
      register_probe("probe/fma/fp32/" + threads, "GFLOP", compute_probe(fma_avx512, t, rounds));
    } else if (has_avx2_fma()) {
      register_probe("probe/fma/fp32/" + threads, "GFLOP", compute_probe(fma_avx2, t, rounds));
    }
    if (has_bf16_dot()) {
      register_probe("probe/dot/bf16/" + threads, "GFLOP",
                     compute_probe(dot_bf16_avx512, t, rounds));
    }
    if (has_amx_bf16()) {
      register_probe("probe/amx/bf16/" + threads, "GFLOP",
                     compute_probe(dot_bf16_amx, t, rounds / 8));
    }
    register_probe("probe/read/fp32/" + threads, "GB", [=] {
      auto buffer = std::make_shared<ProbeBuffer>(floats);
      return [=] { return read_run(buffer->data.get(), buffer->count, t); };
    });
    register_probe("probe/write/fp32/" + threads, "GB", [=] {
      auto buffer = std::make_shared<ProbeBuffer>(floats);
      return [=] { return write_run(buffer->data.get(), buffer->count, t); };
    });
  }
}

}  // namespace gmm_bench
