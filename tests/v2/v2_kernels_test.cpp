// The v2 kernel kits against the portable reference: packers (widening, in-kernel quantization),
// absmax scans and micro-kernels, bit for bit, on every ISA path this CPU runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gmm/kernels/select.hpp"
#include "support/operands.hpp"
#include "support/random.hpp"
#include "v2/v2_cases.hpp"

namespace gmm::test::v2 {
namespace {

using kernels::KernelKit;
using kernels::PackedElement;
using kernels::PanelOrder;
using kernels::PanelSource;

std::int64_t round_up_to(std::int64_t x, std::int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

// The kits this CPU runs: every forced path, fp32 and (where there is one) bf16 data.
std::vector<KernelKit> kits() {
  std::vector<KernelKit> out;
  for (Isa isa : supported_isas()) {
    out.push_back(kernels::select_kit(isa, false));
    if (isa == Isa::avx512bf16 || isa == Isa::amx) out.push_back(kernels::select_kit(isa, true));
  }
  return out;
}

// The reference packer of a kit's format.
kernels::PackFn reference_packer(const KernelKit& kit, PanelOrder order) {
  using kernels::pack_reference;
  const bool bf16 = kit.format.element == PackedElement::bf16;
  if (kit.format.step_multiple == 16) {  // AMX: whole tiles
    return order == PanelOrder::lane_major
               ? pack_reference<PackedElement::bf16, 2, PanelOrder::lane_major, 16>
               : pack_reference<PackedElement::bf16, 2, PanelOrder::step_major, 16>;
  }
  if (order == PanelOrder::lane_major) {
    return bf16 ? pack_reference<PackedElement::bf16, 2, PanelOrder::lane_major>
                : pack_reference<PackedElement::f32, 1, PanelOrder::lane_major>;
  }
  return bf16 ? pack_reference<PackedElement::bf16, 2, PanelOrder::step_major>
              : pack_reference<PackedElement::f32, 1, PanelOrder::step_major>;
}

// Floats that stress quantization: rounding ties and neighbours of every fp8 / int8 value's
// midpoints (relative to a scale of 1), subnormals, the clip boundaries, zeros, infinities, NaN.
std::vector<float> adversarial_values(Rng& rng) {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          448.0f,
                          -448.0f,
                          464.0f,
                          57344.0f,
                          61440.0f,
                          -1e30f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min(),
                          1e-40f,
                          -3e-39f,
                          0.5f,
                          1.5f,
                          2.5f,
                          -0.5f,
                          126.5f,
                          127.5f,
                          -127.5f,
                          128.0f};
  for (int code = 0; code < 256; ++code) {
    for (float x : {static_cast<float>(float8_e4m3fn::from_bits(code)),
                    static_cast<float>(float8_e5m2::from_bits(code))}) {
      if (!std::isfinite(x)) continue;
      v.push_back(x);
      v.push_back(std::nextafter(x, 1e30f));
      v.push_back(std::nextafter(x, -1e30f));
      v.push_back(x * 1.0625f);  // midpoints of e4m3 neighbours
      v.push_back(x * 1.125f);   // midpoints of e5m2 neighbours
    }
  }
  for (int i = 0; i < 2000; ++i) {
    v.push_back(static_cast<float>(rng.normal() * std::exp2(rng.uniform(-30, 20))));
  }
  return v;
}

// One packed panel as comparable 32-bit patterns: NaNs collapse to one pattern.
std::vector<std::uint32_t> canonical(const std::vector<unsigned char>& bytes, PackedElement e) {
  std::vector<std::uint32_t> out;
  const std::size_t size = e == PackedElement::f32 ? 4 : 2;
  for (std::size_t i = 0; i + size <= bytes.size(); i += size) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, bytes.data() + i, size);
    if (size == 2) bits <<= 16;
    float x;
    std::memcpy(&x, &bits, 4);
    out.push_back(std::isnan(x) ? 0x7FC00000u : bits);
  }
  return out;
}

struct PackCase {
  DType dtype;
  bool quantize;
  QType qtype;
};

// Every packer path: both panel orders, both source layouts, every dtype, quantization to every
// qtype, ragged lanes and contraction lengths, against the reference packer bit for bit.
TEST(V2Kernels, PackersMatchReference) {
  Rng rng(7);
  const std::vector<float> values = adversarial_values(rng);
  const std::vector<PackCase> cases = {
      {DType::f32, false, QType::int8},           {DType::bf16, false, QType::int8},
      {DType::float8_e4m3fn, false, QType::int8}, {DType::float8_e5m2, false, QType::int8},
      {DType::int8, false, QType::int8},          {DType::f32, true, QType::float8_e4m3fn},
      {DType::f32, true, QType::float8_e5m2},     {DType::f32, true, QType::int8},
      {DType::bf16, true, QType::float8_e4m3fn},  {DType::bf16, true, QType::float8_e5m2},
      {DType::bf16, true, QType::int8},
  };
  // More lanes than the widest panel (64) past the offset of 2, so every width fits the source.
  const std::int64_t lanes_total = 75, k_total = 131;
  std::vector<KernelKit> packer_kits = kits();
#if GMM_KERNELS_X86
  // The generic B packers of the AVX-512 kits (what CPUs without AVX512_VBMI run for fp8 and,
  // in the bf16-pair kits, bf16 weights), called directly.
  for (const KernelKit& kit : kits()) {
    KernelKit generic = kit;
    if (kit.isa == Isa::avx512f) {
      generic.pack_b = kernels::pack_avx512<PackedElement::f32, PanelOrder::step_major>;
      packer_kits.push_back(generic);
    }
    if (kit.format.element != PackedElement::bf16) continue;
    generic.pack_b = kit.format.step_multiple == 1
                         ? kernels::pack_avx512<PackedElement::bf16, PanelOrder::step_major, 1>
                         : kernels::pack_avx512<PackedElement::bf16, PanelOrder::step_major, 16>;
    packer_kits.push_back(generic);
  }
#endif
  for (const KernelKit& kit : packer_kits) {
    for (const PackCase& c : cases) {
      // bf16 packed panels only ever see data exact in bf16.
      if (kit.format.element == PackedElement::bf16 && c.dtype == DType::f32 && !c.quantize) {
        continue;
      }
      std::vector<unsigned char> data(lanes_total * k_total * size_of(c.dtype));
      for (std::int64_t i = 0; i < lanes_total * k_total; ++i) {
        float x = values[rng.integer(0, static_cast<std::int64_t>(values.size()) - 1)];
        if (!c.quantize && c.dtype == DType::int8) x = static_cast<float>(rng.integer(-128, 127));
        if (!c.quantize && is_quantized(c.dtype)) {
          const std::uint8_t code = static_cast<std::uint8_t>(rng.integer(0, 255));
          if (c.dtype != DType::int8) x = load_as_float(&code, c.dtype, 0);
        }
        store_as(data.data(), c.dtype, i, x);
      }
      std::vector<float> scales(lanes_total);
      for (float& s : scales) s = rng.chance(0.2) ? 1.0f : random_scale(rng);
      for (PanelOrder order : {PanelOrder::lane_major, PanelOrder::step_major}) {
        for (bool lanes_contiguous : {false, true}) {
          PanelSource src{data.data(),
                          c.dtype,
                          lanes_contiguous ? 1 : k_total,
                          lanes_contiguous ? lanes_total : 1,
                          c.quantize,
                          c.qtype};
          const int width = order == PanelOrder::lane_major ? kit.format.mr : kit.format.nr;
          for (std::int64_t lanes : {std::int64_t{1}, std::int64_t{width}, lanes_total - 3}) {
            for (std::int64_t kc : {std::int64_t{1}, std::int64_t{16}, std::int64_t{127}}) {
              const std::int64_t panels = (lanes + width - 1) / width;
              const std::size_t bytes = panels * kit.format.panel_bytes(width, kc);
              std::vector<unsigned char> fast(bytes, 0xAB), slow(bytes, 0xCD);
              const auto packer = order == PanelOrder::lane_major ? kit.pack_a : kit.pack_b;
              packer(src, width, 2, lanes, 3, kc, scales.data() + 2, fast.data());
              reference_packer(kit, order)(src, width, 2, lanes, 3, kc, scales.data() + 2,
                                           slow.data());
              EXPECT_EQ(canonical(fast, kit.format.element), canonical(slow, kit.format.element))
                  << name(kit.isa) << " " << name(c.dtype) << " quantize=" << c.quantize << " "
                  << name(c.qtype) << " order=" << static_cast<int>(order)
                  << " lanes_contiguous=" << lanes_contiguous << " lanes=" << lanes << " kc=" << kc;
            }
          }
        }
      }
    }
  }
}

// The absmax scan equals core/qvalue.hpp's running absmax, NaN included.
TEST(V2Kernels, AbsmaxMatchesReference) {
  Rng rng(8);
  const std::vector<float> values = adversarial_values(rng);
  const std::int64_t lanes = 37, k = 75;
  for (const KernelKit& kit : kits()) {
    for (DType d : {DType::f32, DType::bf16}) {
      for (double nan_chance : {0.0, 0.002}) {
        std::vector<unsigned char> data(lanes * k * size_of(d));
        for (std::int64_t i = 0; i < lanes * k; ++i) {
          float x = values[rng.integer(0, static_cast<std::int64_t>(values.size()) - 1)];
          if (std::isnan(x) || (nan_chance > 0 && rng.chance(nan_chance))) {
            x = nan_chance > 0 ? std::numeric_limits<float>::quiet_NaN() : 1.0f;
          }
          store_as(data.data(), d, i, x);
        }
        for (bool lanes_contiguous : {false, true}) {
          PanelSource src{data.data(), d, lanes_contiguous ? 1 : k, lanes_contiguous ? lanes : 1};
          std::vector<float> fast(lanes - 1), slow(lanes - 1);
          kit.absmax(src, 1, lanes - 1, 2, k - 1, fast.data());
          kernels::absmax_reference(src, 1, lanes - 1, 2, k - 1, slow.data());
          for (std::int64_t w = 0; w + 1 < lanes; ++w) {
            EXPECT_TRUE(std::isnan(slow[w]) ? std::isnan(fast[w]) : fast[w] == slow[w])
                << name(kit.isa) << " " << name(d) << " lane " << w << ": " << fast[w] << " vs "
                << slow[w];
          }
        }
      }
    }
  }
}

// The float with the given bits.
float float_of_bits(std::uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// Values a bf16 rounding with hardware help gets wrong unless it treats them apart: fp32
// subnormals (vcvtne2ps2bf16 flushes them to zero) and NaNs with payloads and signs (it keeps the
// payload; Eigen's bfloat16 gives 0x7FC0 or 0xFFC0).
std::vector<float> bf16_special_values() {
  return {float_of_bits(0x00000001u),
          float_of_bits(0x807FFFFFu),
          float_of_bits(0x00400000u),
          float_of_bits(0x7F800001u),
          float_of_bits(0xFFA12345u),
          float_of_bits(0x7FE54321u),
          -std::numeric_limits<float>::quiet_NaN()};
}

// A kit's output epilogue stores (or adds) fp32 values into f32 / bf16 rows exactly as the
// scalar path does (Eigen's bfloat16 rounding, signed NaN), for row lengths around the vector
// width, rows starting on and off a vector's alignment, through the caches or past them
// (non-temporal stores), without touching elements before or past the row. One value in 16 is a
// subnormal or a NaN (bf16_special_values), so runs of 32 values come both with and without one.
TEST(V2Kernels, StoreRowMatchesScalar) {
  Rng rng(10);
  std::vector<float> values = adversarial_values(rng);
  values.push_back(-std::numeric_limits<float>::quiet_NaN());
  values.push_back(1.0f + 0x1p-8f);  // bf16 ties, to even both ways
  values.push_back(1.0f + 3 * 0x1p-8f);
  values.push_back(std::numeric_limits<float>::max());
  const std::vector<float> specials = bf16_special_values();
  int checked = 0;
  for (const KernelKit& kit : kits()) {
    if (kit.store_row == nullptr) continue;
    ASSERT_NE(kit.store_fence, nullptr) << name(kit.isa);
    for (DType d : {DType::f32, DType::bf16}) {
      for (bool accumulate : {false, true}) {
        for (bool bypass : {false, true}) {
          if (accumulate && bypass) continue;      // not a combination the driver asks for
          for (std::int64_t offset : {0, 1, 5}) {  // elements after a 64-byte boundary
            for (std::int64_t n : {1, 15, 16, 17, 32, 33, 64, 100, 130}) {
              std::vector<float> src(n);
              for (float& x : src) {
                x = rng.integer(0, 15) == 0 ? specials[rng.integer(0, specials.size() - 1)]
                                            : values[rng.integer(0, values.size() - 1)];
              }
              const std::size_t size = size_of(d);
              // the row sits at `offset` in a buffer aligned to 64 bytes, with 5 elements after
              // it; every element around it must stay as it was
              const std::int64_t padded = offset + n + 5;
              std::vector<unsigned char> buffer(padded * size + 64), slow(padded * size);
              const std::size_t shift =
                  (64 - reinterpret_cast<std::uintptr_t>(buffer.data()) % 64) % 64;
              unsigned char* fast = buffer.data() + shift;
              for (std::int64_t j = 0; j < padded; ++j) {
                store_as(fast, d, j, values[rng.integer(0, values.size() - 1)]);
              }
              std::memcpy(slow.data(), fast, slow.size());
              kit.store_row(src.data(), fast + offset * size, d, n, accumulate, bypass);
              if (bypass) kit.store_fence();
              for (std::int64_t j = 0; j < n; ++j) {
                const float old = load_as_float(slow.data(), d, offset + j);
                const float sum = accumulate ? old + src[j] : src[j];
                if (d == DType::f32) {
                  std::memcpy(slow.data() + (offset + j) * 4, &sum, 4);
                } else {
                  const bfloat16 rounded(sum);
                  std::memcpy(slow.data() + (offset + j) * 2, &rounded, 2);
                }
              }
              for (std::int64_t j = 0; j < padded; ++j) {
                // a sum of two NaNs may keep either one's sign: only that is left open
                const bool both_nan = accumulate && std::isnan(load_as_float(fast, d, j)) &&
                                      std::isnan(load_as_float(slow.data(), d, j));
                EXPECT_TRUE(both_nan ||
                            std::memcmp(fast + j * size, slow.data() + j * size, size) == 0)
                    << name(kit.isa) << " " << name(d) << " n " << n << " offset " << offset
                    << " element " << j << (accumulate ? " accumulate" : "")
                    << (bypass ? " bypass" : "");
              }
              ++checked;
            }
          }
        }
      }
    }
  }
  if (kernels::isa_supported(Isa::avx512f)) {
    EXPECT_GT(checked, 0);
  }
}

// store_row rounds to bf16 as Eigen's bfloat16(float) does on every sign, exponent and bf16
// mantissa: each of the 65536 upper halves with the lower halves around its rounding point (0,
// 1, just under, at and just over the tie, all ones) and one random, in one row (so vectors
// and pairs of vectors of 32 come with and without NaNs, subnormals, infinities), through the
// caches and past them.
TEST(V2Kernels, StoreRowRoundsEveryBf16Neighbourhood) {
  Rng rng(12);
  std::vector<float> src;
  for (std::uint32_t upper = 0; upper <= 0xFFFF; ++upper) {
    for (std::uint32_t lower : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu,
                                static_cast<std::uint32_t>(rng.integer(0, 0xFFFF))}) {
      src.push_back(float_of_bits(upper << 16 | lower));
    }
  }
  const std::int64_t n = static_cast<std::int64_t>(src.size());
  std::vector<std::uint16_t> expected(src.size());
  for (std::size_t j = 0; j < src.size(); ++j) {
    const bfloat16 rounded(src[j]);
    std::memcpy(&expected[j], &rounded, sizeof(std::uint16_t));
  }
  int checked = 0;
  for (const KernelKit& kit : kits()) {
    if (kit.store_row == nullptr) continue;
    for (bool bypass : {false, true}) {
      std::vector<std::uint16_t> out(src.size() + 32, 0);  // the row starts on a cache line
      std::uint16_t* row =
          out.data() + (64 - reinterpret_cast<std::uintptr_t>(out.data()) % 64) % 64 / 2;
      kit.store_row(src.data(), row, DType::bf16, n, false, bypass);
      if (bypass) kit.store_fence();
      std::int64_t mismatches = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        if (row[j] != expected[j] && ++mismatches <= 5) {
          std::uint32_t bits;
          std::memcpy(&bits, &src[j], sizeof bits);
          ADD_FAILURE() << name(kit.isa) << (bypass ? " bypass" : "") << " fp32 bits " << std::hex
                        << bits << ": " << row[j] << ", want " << expected[j];
        }
      }
      EXPECT_EQ(mismatches, 0) << name(kit.isa) << (bypass ? " bypass" : "");
      ++checked;
    }
  }
  if (kernels::isa_supported(Isa::avx512f)) {
    EXPECT_GT(checked, 0);
  }
}

// One micro-tile's operands for a kit: A [mr, kc] and B [kc, nr] of small integers (so every
// product and sum is exact), packed by the reference packers in the kit's format, and
// power-of-two row and column scales.
struct IntegerTile {
  std::int64_t kc = 0, cols = 0;
  std::vector<float> a, b, rs, cs;
  std::vector<unsigned char> pa, pb;

  // One A panel and `b_panels` B panels (consecutive in pb) of `depth` contraction indices.
  IntegerTile(Rng& rng, const KernelKit& kit, std::int64_t depth, int b_panels = 1)
      : kc(depth), cols(b_panels * kit.format.nr) {
    const auto& f = kit.format;
    a.resize(f.mr * kc);
    b.resize(kc * cols);
    for (float& x : a) x = static_cast<float>(rng.integer(-8, 8));
    for (float& x : b) x = static_cast<float>(rng.integer(-8, 8));
    rs.resize(f.mr);
    cs.resize(cols);
    for (float& s : rs) s = std::exp2(static_cast<float>(rng.integer(-3, 3)));
    for (float& s : cs) s = std::exp2(static_cast<float>(rng.integer(-3, 3)));
    PanelSource sa{a.data(), DType::f32, kc, 1}, sb{b.data(), DType::f32, 1, cols};
    pa.resize(f.panel_bytes(f.mr, kc));
    pb.resize(b_panels * f.panel_bytes(f.nr, kc));
    reference_packer(kit, PanelOrder::lane_major)(sa, f.mr, 0, f.mr, 0, kc, rs.data(), pa.data());
    reference_packer(kit, PanelOrder::step_major)(sb, f.nr, 0, cols, 0, kc, cs.data(), pb.data());
  }
  // Element (i, j) of A B, exact.
  double sum(int i, std::int64_t j) const {
    double total = 0;
    for (std::int64_t k = 0; k < kc; ++k) total += a[i * kc + k] * b[k * cols + j];
    return total;
  }
};

// Each micro-kernel computes c (= / +=) (A B) * row_scale * col_scale; with small integers
// every sum is exact, so it must equal the scalar loop bit for bit.
TEST(V2Kernels, MicroKernelsAreExactOnIntegers) {
  Rng rng(9);
  for (const KernelKit& kit : kits()) {
    const auto& f = kit.format;
    const IntegerTile tile(rng, kit, 45);
    const std::int64_t steps = f.steps(tile.kc);
    const std::vector<float>&rs = tile.rs, &cs = tile.cs;
    const std::vector<unsigned char>&pa = tile.pa, &pb = tile.pb;
    const std::int64_t ldc = f.nr + 3;
    for (bool few : {false, true}) {
      if (few && kit.few_rows_kernel == nullptr) continue;
      const kernels::MicroKernelFn kernel = few ? kit.few_rows_kernel : kit.kernel;
      const int rows = few ? kit.few_rows - 1 : f.mr - 1;  // valid rows: stored, the rest not
      std::vector<float> c(f.mr * ldc, 5.0f);
      if (kit.begin != nullptr) kit.begin();
      kernel(steps, pa.data(), pb.data(), c.data(), ldc, rs.data(), cs.data(), true, rows);
      kernel(steps, pa.data(), pb.data(), c.data(), ldc, rs.data(), cs.data(), false, rows);
      if (kit.end != nullptr) kit.end();
      for (int i = 0; i < f.mr; ++i) {
        for (int j = 0; j < f.nr; ++j) {
          const double sum = tile.sum(i, j);
          EXPECT_EQ(c[i * ldc + j], i < rows ? static_cast<float>(2 * sum * rs[i] * cs[j]) : 5.0f)
              << name(kit.isa) << " few=" << few << " " << i << "," << j;
        }
        for (std::int64_t j = f.nr; j < ldc; ++j) EXPECT_EQ(c[i * ldc + j], 5.0f);
      }
    }
  }
}

// A kit's output kernel writes what its micro-kernel computes (first), rounded to f32 / bf16 as
// the scalar path rounds (Eigen's bfloat16), straight into rows of the output, for the five tiles
// of one call (five B panels; the AMX kernel computes four before it stores them): exact integer
// products times power-of-two scales, one row scaled into fp32 subnormals, one made NaN by its
// scale and one holding a subnormal or a NaN in a single column of each tile (vectors with and
// without such values); the rows past `rows`, the padding of each row and the row after the tiles
// untouched.
TEST(V2Kernels, OutputKernelsMatchScalar) {
  Rng rng(11);
  int checked = 0;
  for (const KernelKit& kit : kits()) {
    if (kit.output_kernel == nullptr) continue;
    ASSERT_NE(kit.store_fence, nullptr) << name(kit.isa);
    const auto& f = kit.format;
    constexpr int kTiles = 5;
    IntegerTile tile(rng, kit, 37, kTiles);
    const std::int64_t steps = f.steps(tile.kc);
    std::vector<float>&rs = tile.rs, &cs = tile.cs;  // scales are not packed: set them now
    rs[0] = 0x1p-135f;                               // subnormal products
    rs[1] = std::numeric_limits<float>::quiet_NaN();
    for (int t = 0; t < kTiles; ++t) {
      cs[t * f.nr + f.nr / 2 + t] = float_of_bits(0x7F800001u);  // NaN with a payload
      cs[t * f.nr + f.nr / 2 + 1 + t] = 0x1p-140f;
    }
    const std::vector<unsigned char>&pa = tile.pa, &pb = tile.pb;
    const int rows = f.mr - 1;  // valid rows: written, the last one not
    for (DType d : {DType::f32, DType::bf16}) {
      const std::size_t size = size_of(d);
      const std::int64_t row_stride = tile.cols + 64 / static_cast<std::int64_t>(size);  // + line
      const std::int64_t elements = (f.mr + 1) * row_stride;
      std::vector<unsigned char> buffer(elements * size + 64);
      unsigned char* out =
          buffer.data() + (64 - reinterpret_cast<std::uintptr_t>(buffer.data()) % 64) % 64;
      for (std::int64_t e = 0; e < elements; ++e) store_as(out, d, e, 5.0f);
      if (kit.begin != nullptr) kit.begin();
      kit.output_kernel(steps, pa.data(), pb.data(), f.panel_bytes(f.nr, tile.kc), kTiles, out,
                        row_stride, d, rs.data(), cs.data(), rows);
      if (kit.end != nullptr) kit.end();
      kit.store_fence();
      for (int i = 0; i <= f.mr; ++i) {
        for (std::int64_t j = 0; j < row_stride; ++j) {
          float want = 5.0f;
          if (i < rows && j < tile.cols) {  // the kernel's fp32 operations
            want = static_cast<float>(tile.sum(i, j)) * rs[i] * cs[j];
          }
          unsigned char expected[4];
          store_as(expected, d, 0, want);
          const bool nan = std::isnan(want);  // f32: NaN bits are the product's, left open
          EXPECT_TRUE(d == DType::f32 && nan
                          ? std::isnan(load_as_float(out, d, i * row_stride + j))
                          : std::memcmp(out + (i * row_stride + j) * size, expected, size) == 0)
              << name(kit.isa) << " " << name(d) << " row " << i << " column " << j;
        }
      }
      ++checked;
    }
  }
  if (kernels::isa_supported(Isa::avx512f)) {
    EXPECT_GT(checked, 0);
  }
}

// The B dtypes a kit's streaming kernel can meet: all of them for fp32 kits, the bf16-exact
// ones for bf16 kits.
std::vector<DType> stream_dtypes(const KernelKit& kit) {
  std::vector<DType> out = {DType::bf16, DType::float8_e4m3fn, DType::float8_e5m2, DType::int8};
  if (kit.format.element == PackedElement::f32) out.push_back(DType::f32);
  return out;
}

// A [lanes, contraction] B operand of `dtype` holding the given values, stored with contiguous
// lanes ([K, N] weights) or contiguous contraction runs, in a buffer with padding on both axes.
struct StreamOperand {
  std::vector<unsigned char> data;
  PanelSource source;
};

StreamOperand stream_operand(const std::vector<float>& values, DType dtype, std::int64_t lanes,
                             std::int64_t depth, bool runs) {
  StreamOperand op;
  const std::int64_t lane_stride = runs ? depth + 5 : 1, k_stride = runs ? 1 : lanes + 7;
  const std::int64_t elements = runs ? lanes * lane_stride : depth * k_stride;
  op.data.assign(static_cast<std::size_t>(elements) * size_of(dtype), 0);
  for (std::int64_t l = 0; l < lanes; ++l) {
    for (std::int64_t k = 0; k < depth; ++k) {
      store_as(op.data.data(), dtype, l * lane_stride + k * k_stride, values[l * depth + k]);
    }
  }
  op.source = {op.data.data(), dtype, lane_stride, k_stride};
  return op;
}

// The factor of chunk s's scales in run_stream: powers of two, so exact sums stay exact.
float chunk_factor(std::int64_t s) { return std::ldexp(1.0f, static_cast<int>(s % 3 - s % 2)); }

// Runs a streaming kernel twice (first, then accumulating) over columns [n0, n1) and contraction
// [k0, k0 + kc) of B, cut into chunks of `chunk` indices (the last may be shorter; 0: one chunk),
// chunk s with row scales rs and column scales cs times chunk_factor(s), and returns C with
// sentinels around the written block.
std::vector<float> run_stream(kernels::StreamFn stream, const KernelKit& kit, const PanelSource& b,
                              const std::vector<float>& a, std::int64_t depth, int rows,
                              std::int64_t n0, std::int64_t n1, std::int64_t k0, std::int64_t kc,
                              const std::vector<float>& rs, const std::vector<float>& cs,
                              std::int64_t ldc, std::int64_t chunk = 0) {
  const kernels::PackedFormat& f = kit.format;
  const PanelSource sa{a.data(), DType::f32, depth, 1};
  const std::int64_t length = chunk > 0 ? chunk : std::max<std::int64_t>(kc, 1);
  const std::int64_t count = (kc + length - 1) / length;
  std::vector<std::vector<unsigned char>> panels(count);
  std::vector<std::vector<float>> row_scales(count), col_scales(count);
  std::vector<kernels::StreamChunk> chunks(count);
  for (std::int64_t s = 0; s < count; ++s) {
    kernels::StreamChunk& c = chunks[s];
    c.k0 = k0 + s * length;
    c.kc = std::min(length, k0 + kc - c.k0);
    for (float x : rs) row_scales[s].push_back(x * chunk_factor(s));
    for (std::int64_t j = n0; j < n1; ++j) col_scales[s].push_back(cs[j] * chunk_factor(s));
    panels[s].resize(f.panel_bytes(rows, c.kc));
    reference_packer(kit, PanelOrder::lane_major)(sa, rows, 0, rows, c.k0, c.kc,
                                                  row_scales[s].data(), panels[s].data());
    c.a = panels[s].data();
    c.a_stride = f.steps(c.kc) * f.depth;
    c.row_scales = row_scales[s].data();
    c.col_scales = col_scales[s].data();
  }
  std::vector<float> c(static_cast<std::size_t>((rows + 1) * ldc), 5.0f);
  for (bool first : {true, false}) {
    stream(b, n0, n1, chunks.data(), count, rows, c.data(), ldc, first);
  }
  return c;
}

// Row counts the streaming tests run: every count up to `most` (a kit's stream_rows(b), at least
// 4: every kernel takes 1 to 4), then each of the strip kernel's block widths (5 to 24 rows: one
// block; 25 to 32: two).
std::vector<int> stream_row_counts(int most) {
  std::vector<int> out;
  for (int rows = 1; rows <= most; ++rows) out.push_back(rows);
  return out;
}

#if GMM_KERNELS_X86
// This CPU's features without AVX512_VBMI: the kits' streams then take what they run on CPUs
// that lack it (fp8 widened by arithmetic, no strip kernel).
kernels::CpuFeatures without_vbmi() {
  kernels::CpuFeatures f = kernels::cpu_features();
  f.avx512vbmi = false;
  return f;
}

// The AVX512_BF16 and AVX-512F kits' streams as on a CPU without AVX512_VBMI, as StreamFns.
void stream_bf16_without_vbmi(const PanelSource& b, std::int64_t n0, std::int64_t n1,
                              const kernels::StreamChunk* chunks, std::int64_t count, int rows,
                              float* c, std::int64_t ldc, bool first) {
  kernels::stream_avx512_bf16_on(without_vbmi(), b, n0, n1, chunks, count, rows, c, ldc, first);
}

void stream_f32_without_vbmi(const PanelSource& b, std::int64_t n0, std::int64_t n1,
                             const kernels::StreamChunk* chunks, std::int64_t count, int rows,
                             float* c, std::int64_t ldc, bool first) {
  kernels::stream_avx512_f32_on(without_vbmi(), b, n0, n1, chunks, count, rows, c, ldc, first);
}
#endif

// Each streaming kernel computes c (= / +=) the sum over its chunks of (A B) * row_scale *
// col_scale from unpacked B; with small integers and power-of-two scales every sum is exact, so it
// must equal the scalar loop bit for bit: both B layouts, every B dtype, every row count the kit
// streams, ragged column ranges (one wider than the strip kernel's span of 1024 columns, over more
// than two of its 64-pair bands), odd contraction lengths, one chunk or several (scale segments,
// some shorter than a 64-index block, some not starting on one).
TEST(V2Kernels, StreamKernelsAreExactOnIntegers) {
  Rng rng(10);
  const std::int64_t lanes = 1100, depth = 300, max_rows = 32;
  std::vector<float> a(max_rows * depth), values(lanes * depth);
  for (float& x : a) x = static_cast<float>(rng.integer(-8, 8));
  for (float& x : values) x = static_cast<float>(rng.integer(-8, 8));
  std::vector<float> rs(max_rows), cs(lanes);
  for (float& s : rs) s = std::exp2(static_cast<float>(rng.integer(-3, 3)));
  for (float& s : cs) s = std::exp2(static_cast<float>(rng.integer(-3, 3)));
  struct Range {
    std::int64_t n0, n1, k0, kc, chunk;  // chunk: see run_stream
  };
  const std::vector<Range> ranges = {
      {0, 1, 0, 1, 0},       {3, 20, 5, 45, 0},      {0, 64, 0, 64, 0},  {7, 333, 2, 131, 0},
      {64, 200, 11, 128, 0}, {5, 1100, 1, 270, 0},   {0, 64, 0, 64, 16}, {7, 333, 2, 131, 64},
      {9, 50, 3, 297, 128},  {5, 1100, 1, 270, 100}, {1, 30, 10, 90, 7}};
  // per range: the exact sums of every row with chunk_factor(s)^2, row i at i * (n1 - n0)
  std::vector<std::vector<double>> sums;
  for (const Range& r : ranges) {
    std::vector<double>& range_sums = sums.emplace_back(max_rows * (r.n1 - r.n0), 0.0);
    for (std::int64_t i = 0; i < max_rows; ++i) {
      for (std::int64_t j = 0; j < r.n1 - r.n0; ++j) {
        for (std::int64_t k = r.k0; k < r.k0 + r.kc; ++k) {
          const double factor = r.chunk > 0 ? chunk_factor((k - r.k0) / r.chunk) : 1.0;
          range_sums[i * (r.n1 - r.n0) + j] +=
              a[i * depth + k] * values[(r.n0 + j) * depth + k] * factor * factor;
        }
      }
    }
  }
  int checked = 0;
  for (const KernelKit& kit : kits()) {
    ASSERT_NE(kit.stream, nullptr) << name(kit.isa);
    std::vector<std::pair<std::string, kernels::StreamFn>> streams = {{"kit", kit.stream}};
#if GMM_KERNELS_X86
    // The kit's stream as on a CPU without AVX512_VBMI (the kit's own takes the table kernels
    // and the strip kernel where the CPU has it).
    if (kit.format.element == PackedElement::bf16) {
      streams.push_back({"without VBMI", stream_bf16_without_vbmi});
    } else if (kit.isa == Isa::avx512f) {
      streams.push_back({"without VBMI", stream_f32_without_vbmi});
    }
#endif
    for (const auto& [label, stream] : streams) {
      for (DType dtype : stream_dtypes(kit)) {
        if (label != "kit" && dtype != DType::float8_e4m3fn && dtype != DType::float8_e5m2) {
          continue;  // only fp8 streams differ without AVX512_VBMI
        }
        for (bool runs : {false, true}) {
          const StreamOperand b = stream_operand(values, dtype, lanes, depth, runs);
          // every streaming kernel takes 1 to 4 rows, though a kit may hand it fewer (AMX)
          const int most = label == "kit" ? std::max(4, kit.stream_rows(b.source)) : 4;
          ASSERT_LE(most, max_rows) << name(kit.isa);
          for (int rows : stream_row_counts(most)) {
            for (std::size_t ri = 0; ri < ranges.size(); ++ri) {
              const Range& r = ranges[ri];
              const std::int64_t ldc = r.n1 - r.n0 + 3;
              const std::vector<float> c = run_stream(stream, kit, b.source, a, depth, rows, r.n0,
                                                      r.n1, r.k0, r.kc, rs, cs, ldc, r.chunk);
              for (int i = 0; i <= rows; ++i) {
                for (std::int64_t j = 0; j < ldc; ++j) {
                  float expected = 5.0f;
                  if (i < rows && j < r.n1 - r.n0) {
                    const double sum = sums[ri][i * (r.n1 - r.n0) + j];
                    expected = static_cast<float>(2 * sum * rs[i] * cs[r.n0 + j]);
                  }
                  ASSERT_EQ(c[i * ldc + j], expected)
                      << name(kit.isa) << " " << label << " " << name(dtype) << " runs=" << runs
                      << " rows=" << rows << " n=[" << r.n0 << "," << r.n1 << ") k0=" << r.k0
                      << " kc=" << r.kc << " chunk=" << r.chunk << " at " << i << "," << j;
                }
              }
              ++checked;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

#if GMM_KERNELS_X86
// On a CPU with AVX512_VBMI the AVX-512F kit streams fp8 weights widened by table lookups; they
// must give the same bits as the arithmetic widening over every code (subnormals, zeros of both
// signs and NaN included: NaN sums only need to be NaN), in both layouts, for every row count,
// over ragged ranges.
TEST(V2Kernels, Fp8TableStreamsMatchArithmeticWideningBits) {
  if (!kernels::isa_supported(Isa::avx512f) || !kernels::cpu_features().avx512vbmi) {
    GTEST_SKIP() << "needs AVX-512F and AVX512_VBMI";
  }
  const KernelKit kit = kernels::select_kit(Isa::avx512f, false);
  Rng rng(12);
  const std::int64_t lanes = 300, depth = 333;
  std::vector<float> a(4 * depth), rs(4), cs(lanes);
  for (float& x : a) x = random_value(rng, DType::f32);
  for (float& s : rs) s = random_scale(rng);
  for (float& s : cs) s = random_scale(rng);
  const std::vector<std::array<std::int64_t, 5>> ranges = {// n0, n1, k0, kc, chunk
                                                           {0, 300, 0, 333, 0},
                                                           {5, 77, 3, 64, 0},
                                                           {64, 65, 1, 200, 0},
                                                           {13, 290, 7, 63, 0},
                                                           {2, 250, 5, 320, 128}};
  std::array<std::uint8_t, 256> codes;
  for (int c = 0; c < 256; ++c) codes[c] = static_cast<std::uint8_t>(c);
  int checked = 0;
  for (DType dtype : {DType::float8_e4m3fn, DType::float8_e5m2}) {
    // every code; the non-finite ones only in every 37th lane, so the other sums stay finite
    std::vector<float> values(lanes * depth);
    for (std::int64_t i = 0; i < lanes * depth; ++i) {
      do {
        values[i] = load_as_float(codes.data(), dtype, rng.integer(0, 255));
      } while (!std::isfinite(values[i]) && (i / depth) % 37 != 5);
    }
    for (bool runs : {false, true}) {
      const StreamOperand b = stream_operand(values, dtype, lanes, depth, runs);
      for (int rows = 1; rows <= 4; ++rows) {
        for (const auto& [n0, n1, k0, kc, chunk] : ranges) {
          const std::int64_t ldc = n1 - n0 + 1;
          const std::vector<float> tables = run_stream(kit.stream, kit, b.source, a, depth, rows,
                                                       n0, n1, k0, kc, rs, cs, ldc, chunk);
          const std::vector<float> arithmetic =
              run_stream(stream_f32_without_vbmi, kit, b.source, a, depth, rows, n0, n1, k0, kc, rs,
                         cs, ldc, chunk);
          for (std::size_t q = 0; q < tables.size(); ++q) {
            // a sum of NaNs of both signs may keep either (the FMA's operand order picks it)
            if (std::isnan(tables[q]) && std::isnan(arithmetic[q])) continue;
            ASSERT_EQ(std::memcmp(&tables[q], &arithmetic[q], sizeof(float)), 0)
                << name(dtype) << " runs=" << runs << " rows=" << rows << " n=[" << n0 << "," << n1
                << ") k0=" << k0 << " kc=" << kc << " chunk=" << chunk << " at " << q << ": "
                << tables[q] << " vs " << arithmetic[q];
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 2 * 4 * 5);
}
#endif

// Over B with contiguous columns the streaming kernels sum each column in the packed
// micro-kernel's order, so on arbitrary data their results equal the packed path's bit for bit
// (on the kits whose stream and micro-kernel use the same instruction: scalar, AVX-512F,
// AVX512_BF16), for every row count the kit streams, over more than one of the strip kernel's
// spans (1024 columns) and bands (64 pairs).
TEST(V2Kernels, StreamMatchesPackedKernelBits) {
  Rng rng(11);
  const std::int64_t lanes = 1100, depth = 277, max_rows = 32;
  for (const KernelKit& kit : kits()) {
    if (kit.isa != Isa::scalar && kit.isa != Isa::avx512f && kit.isa != Isa::avx512bf16) continue;
    const kernels::PackedFormat& f = kit.format;
    for (DType dtype : stream_dtypes(kit)) {
      std::vector<float> a(max_rows * depth), values(lanes * depth);
      const DType a_dtype = f.element == PackedElement::bf16 ? DType::bf16 : DType::f32;
      for (float& x : a) x = random_value(rng, a_dtype);
      for (float& x : values) x = random_value(rng, dtype);
      std::vector<float> rs(round_up_to(max_rows, f.mr), 0.0f), cs(round_up_to(lanes, f.nr), 0.0f);
      for (int i = 0; i < max_rows; ++i) rs[i] = random_scale(rng);
      for (std::int64_t j = 0; j < lanes; ++j) cs[j] = random_scale(rng);
      const StreamOperand b = stream_operand(values, dtype, lanes, depth, false);
      for (int rows : stream_row_counts(kit.stream_rows(b.source))) {
        const std::int64_t ldc = round_up_to(lanes, f.nr);
        const std::vector<float> streamed =
            run_stream(kit.stream, kit, b.source, a, depth, rows, 0, lanes, 0, depth, rs, cs, ldc);
        // the packed path: A in panels of mr rows, B packed in nr-wide panels
        const std::int64_t rows_padded = round_up_to(rows, f.mr);
        PanelSource sa{a.data(), DType::f32, depth, 1};
        const std::size_t a_panel = f.panel_bytes(f.mr, depth);
        std::vector<unsigned char> pa((rows_padded / f.mr) * a_panel);
        reference_packer(kit, PanelOrder::lane_major)(sa, f.mr, 0, rows, 0, depth, rs.data(),
                                                      pa.data());
        std::vector<unsigned char> pb((ldc / f.nr) * f.panel_bytes(f.nr, depth));
        kit.pack_b(b.source, f.nr, 0, lanes, 0, depth, cs.data(), pb.data());
        std::vector<float> packed(static_cast<std::size_t>(rows_padded * ldc), 5.0f);
        for (bool first : {true, false}) {
          for (std::int64_t ir = 0; ir < rows; ir += f.mr) {
            const int valid = static_cast<int>(std::min<std::int64_t>(f.mr, rows - ir));
            const bool few = kit.few_rows_kernel != nullptr && valid <= kit.few_rows;
            const auto kernel = few ? kit.few_rows_kernel : kit.kernel;
            for (std::int64_t jr = 0; jr < ldc; jr += f.nr) {
              kernel(f.steps(depth), pa.data() + (ir / f.mr) * a_panel,
                     pb.data() + (jr / f.nr) * f.panel_bytes(f.nr, depth),
                     packed.data() + ir * ldc + jr, ldc, rs.data() + ir, cs.data() + jr, first,
                     valid);
            }
          }
        }
        for (int i = 0; i < rows; ++i) {
          for (std::int64_t j = 0; j < lanes; ++j) {
            ASSERT_EQ(std::memcmp(&streamed[i * ldc + j], &packed[i * ldc + j], 4), 0)
                << name(kit.isa) << " " << name(dtype) << " rows=" << rows << " at " << i << ","
                << j << ": " << streamed[i * ldc + j] << " vs " << packed[i * ldc + j];
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace gmm::test::v2
