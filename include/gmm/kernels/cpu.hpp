// CPU feature detection (cpuid + xgetbv) and the choice of micro-kernel ISA (Options::isa,
// GMM_ISA).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "gmm/core/error.hpp"
#include "gmm/core/options.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GMM_KERNELS_X86 1
#include <cpuid.h>
#include <immintrin.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#else
#define GMM_KERNELS_X86 0
#endif

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -W(maybe-)uninitialized
// reports once inlined (GCC PR 105593); the values are fully defined. The kernel headers wrap
// their code in these two.
#if defined(__GNUC__) && !defined(__clang__)
#define GMM_KERNELS_SILENCE_UNDEFINED_WARNINGS                                               \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define GMM_KERNELS_RESTORE_WARNINGS _Pragma("GCC diagnostic pop")
#else
#define GMM_KERNELS_SILENCE_UNDEFINED_WARNINGS
#define GMM_KERNELS_RESTORE_WARNINGS
#endif

namespace gmm::kernels {

// Bytes of a cache line (x86-64): the unit prefetches fetch and non-temporal stores write whole.
constexpr std::int64_t kCacheLineBytes = 64;

// Values of `element` bytes from `dst` on (at most n) before the first cache-line boundary: all n
// when the row's values cannot start on a line.
inline std::int64_t values_before_line(const void* dst, std::int64_t element, std::int64_t n) {
  const auto misaligned =
      static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(dst) % kCacheLineBytes);
  return misaligned % element != 0
             ? n
             : std::min(n, (kCacheLineBytes - misaligned) % kCacheLineBytes / element);
}

// Prefetches the line at `line` into L2. On x86 an asm statement, not _mm_prefetch: GCC takes
// __builtin_prefetch for free of side effects, finds a function whose loop only prefetches pure,
// and drops its calls.
inline void prefetch_line_l2(const void* line) {
#if GMM_KERNELS_X86
  asm volatile("prefetcht1 (%0)" : : "r"(line));
#elif defined(__GNUC__)
  __builtin_prefetch(line, 0, 2);
#else
  static_cast<void>(line);
#endif
}

// What the running CPU and OS can execute; each flag already includes OS support of the
// register state (xgetbv) and every companion extension the path's kernels use.
struct CpuFeatures {
  bool avx2 = false;        // AVX2 + FMA, ymm state enabled
  bool avx512f = false;     // AVX-512 F/BW/DQ/VL, zmm and opmask state enabled
  bool avx512bf16 = false;  // avx512f plus AVX512_BF16 (vdpbf16ps, vcvtne2ps2bf16)
  // vdpbf16ps does more multiply-adds per cycle than fp32 FMA (AMD Zen 4: twice). On Intel
  // cores it does not (measured on Sapphire Rapids: half the FMA rate), so there the fp32 FMA
  // kernel on exactly widened values is the faster choice for bf16 / fp8 / int8 data.
  bool bf16_dot_beats_fma = false;
  bool amx = false;  // avx512bf16 + AVX512_VBMI + AMX-TILE / AMX-BF16, tile state granted by the OS
  bool avx512vbmi = false;  // avx512f plus AVX512_VBMI (vpermb, vpermi2b / vpermt2b)
  // The streaming kernels prefetch the next band of weight rows into L2 in software
  // (RowPrefetcher). On AMD Zen 4 streamed bands ran 30% slower without; on Intel Ice Lake the
  // fp32 and bf16 decode forward ran 1.4x to 1.5x faster without (2 threads), so Intel CPUs
  // leave it to the hardware prefetchers, except for rows shorter than a page (RowPrefetcher).
  bool row_prefetch = false;
};

#if GMM_KERNELS_X86
// Asks Linux for the AMX tile data state (once per process); false where it is refused or the
// OS is not Linux.
inline bool request_amx_state() {
#if defined(__linux__)
  constexpr long kArchRequestXcompPerm = 0x1023, kXfeatureTileData = 18;
  return syscall(SYS_arch_prctl, kArchRequestXcompPerm, kXfeatureTileData) == 0;
#else
  return false;
#endif
}
#endif

inline CpuFeatures detect_cpu_features() {
  CpuFeatures f;
#if GMM_KERNELS_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid(0, a, b, c, d);
  const bool intel = b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;  // GenuineIntel
  __cpuid(1, a, b, c, d);
  const bool osxsave = c & (1u << 27), fma = c & (1u << 12);
  if (!osxsave) return f;
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  const bool ymm_state = (xcr0_low & 0x6u) == 0x6u;
  const bool zmm_state = (xcr0_low & 0xE6u) == 0xE6u;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned max_subleaf = a;
  const bool amx_tile = d & (1u << 24), amx_bf16 = d & (1u << 22), vbmi = c & (1u << 1);
  const bool tile_state = (xcr0_low & 0x60000u) == 0x60000u;
  const bool avx2 = b & (1u << 5);
  const bool avx512 = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) && (b & (1u << 31));
  bool bf16 = false;
  if (max_subleaf >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    bf16 = a & (1u << 5);
  }
  f.avx2 = ymm_state && avx2 && fma;
  f.avx512f = f.avx2 && zmm_state && avx512;
  f.avx512bf16 = f.avx512f && bf16;
  f.bf16_dot_beats_fma = f.avx512bf16 && !intel;
  f.avx512vbmi = f.avx512f && vbmi;
  f.row_prefetch = !intel;
  f.amx = f.avx512bf16 && vbmi && amx_tile && amx_bf16 && tile_state && request_amx_state();
#endif
  return f;
}

inline const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect_cpu_features();
  return features;
}

inline bool isa_supported(Isa isa, const CpuFeatures& f = cpu_features()) {
  switch (isa) {
    case Isa::automatic:
    case Isa::scalar:
      return true;
    case Isa::avx2:
      return f.avx2;
    case Isa::avx512f:
      return f.avx512f;
    case Isa::avx512bf16:
      return f.avx512bf16;
    case Isa::amx:
      return f.amx;
  }
  return false;
}

// The widest path this CPU supports.
inline Isa best_isa(const CpuFeatures& f = cpu_features()) {
  return f.amx          ? Isa::amx
         : f.avx512bf16 ? Isa::avx512bf16
         : f.avx512f    ? Isa::avx512f
         : f.avx2       ? Isa::avx2
                        : Isa::scalar;
}

// The ISA a call runs: Options::isa when set, else the GMM_ISA environment variable (scalar,
// avx2, avx512f, avx512bf16, amx) when set, else the widest supported. Forcing a path the CPU
// lacks, or an unknown GMM_ISA value, is a gmm::Error.
inline Isa resolve_isa(const char* where, Isa requested,
                       const CpuFeatures& features = cpu_features()) {
  Isa isa = requested;
  if (isa == Isa::automatic) {
    const char* env = std::getenv("GMM_ISA");
    if (env == nullptr || *env == '\0') return best_isa(features);
    const std::string_view text(env);
    for (Isa candidate : {Isa::scalar, Isa::avx2, Isa::avx512f, Isa::avx512bf16, Isa::amx}) {
      if (text == name(candidate)) isa = candidate;
    }
    detail::require(isa != Isa::automatic, where, "GMM_ISA",
                    "one of scalar, avx2, avx512f, avx512bf16, amx", text);
  }
  detail::require(isa_supported(isa, features), where, "isa",
                  "an instruction set this CPU supports", name(isa));
  return isa;
}

}  // namespace gmm::kernels
