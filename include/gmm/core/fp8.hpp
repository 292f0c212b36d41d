// The two OCP fp8 formats (float8_e4m3fn, float8_e5m2): exact decoding, RNE encoding, saturation.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace gmm {

// How an fp8 encode treats values beyond the format's range.
//   none:   ml_dtypes / PyTorch default: overflow -> NaN (e4m3fn) or inf (e5m2), inf -> NaN / inf.
//   finite: ml_dtypes saturating cast: finite overflow -> +-max, inf stays inf (e5m2) / NaN
//   (e4m3fn). all:    CUDA __NV_SATFINITE / torchao: finite overflow and inf -> +-max.
// NaN stays NaN in every mode.
enum class Saturation : std::uint8_t { none, finite, all };

namespace detail {

// Bit layout of one fp8 format; the encoder and decoder are generic over it.
template <int kExponentBits, int kMantissaBits, bool kHasInfinity>
struct Fp8Format {
  static constexpr int exponent_bits = kExponentBits;
  static constexpr int mantissa_bits = kMantissaBits;
  static constexpr int bias = (1 << (kExponentBits - 1)) - 1;
  static constexpr bool has_infinity = kHasInfinity;
  // Largest finite magnitude code: e4m3fn 0x7E (448), e5m2 0x7B (57344).
  static constexpr std::uint8_t max_code = kHasInfinity ? 0x7B : 0x7E;
  static constexpr std::uint8_t infinity_code = 0x7C;  // e5m2 only
  static constexpr std::uint8_t nan_code = kHasInfinity ? 0x7E : 0x7F;
};

using E4M3FnFormat = Fp8Format<4, 3, false>;
using E5M2Format = Fp8Format<5, 2, true>;

inline std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

inline float bits_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

template <typename Format>
constexpr float decode_code(std::uint8_t code) {
  constexpr int m_bits = Format::mantissa_bits;
  const bool negative = code & 0x80;
  const int exponent = (code & 0x7F) >> m_bits;
  const int mantissa = code & ((1 << m_bits) - 1);
  float magnitude = 0.0f;
  if (exponent == (1 << Format::exponent_bits) - 1 &&
      (Format::has_infinity || mantissa == (1 << m_bits) - 1)) {
    magnitude = (Format::has_infinity && mantissa == 0) ? std::numeric_limits<float>::infinity()
                                                        : std::numeric_limits<float>::quiet_NaN();
  } else {
    // value = significand * 2^(e - bias - m_bits), significand with the implicit bit if normal.
    const int significand = exponent == 0 ? mantissa : mantissa | (1 << m_bits);
    const int power = (exponent == 0 ? 1 : exponent) - Format::bias - m_bits;
    float scale = 1.0f;
    for (int i = 0; i < (power < 0 ? -power : power); ++i) scale *= 2.0f;
    magnitude = power < 0 ? significand / scale : significand * scale;
  }
  return negative ? -magnitude : magnitude;
}

template <typename Format>
struct DecodeTable {
  std::array<float, 256> values;
  constexpr DecodeTable() : values() {
    for (int c = 0; c < 256; ++c) values[c] = decode_code<Format>(static_cast<std::uint8_t>(c));
  }
};

// Exact fp32 value of every code, built at compile time.
template <typename Format>
inline constexpr DecodeTable<Format> kDecodeTable{};

template <typename Format>
constexpr const std::array<float, 256>& decode_table() {
  return kDecodeTable<Format>.values;
}

// bf16 bits of every code: the upper half of its exact fp32 value (fp8 values have at most 3
// significant bits, so nothing is lost).
template <typename Format>
inline const std::array<std::uint16_t, 256>& decode_table_bf16() {
  static const std::array<std::uint16_t, 256> table = [] {
    std::array<std::uint16_t, 256> bits{};
    for (int c = 0; c < 256; ++c) {
      bits[c] = static_cast<std::uint16_t>(float_bits(decode_table<Format>()[c]) >> 16);
    }
    return bits;
  }();
  return table;
}

// condition ? a : b by masking, which compilers keep branch-free (a ternary may become a jump).
inline std::uint32_t select(bool condition, std::uint32_t a, std::uint32_t b) {
  return b ^ ((a ^ b) & (0u - static_cast<std::uint32_t>(condition)));
}

// Round-to-nearest-even encode of the fp32 value with bits `u`, subnormals included, overflow
// checked after rounding. Branch-free (selects only), so loops over buffers vectorize.
template <typename Format, Saturation kSaturation>
inline std::uint8_t encode_bits(std::uint32_t u) {
  constexpr int m_bits = Format::mantissa_bits;
  constexpr int shift = 23 - m_bits;
  constexpr std::uint32_t inf_bits = 0x7F800000u;
  constexpr std::uint32_t min_normal_bits = static_cast<std::uint32_t>(127 + 1 - Format::bias)
                                            << 23;
  // 2^(24 - bias - m_bits): its ulp is the smallest subnormal, so adding a subnormal-range value
  // to it rounds that value to a whole number of subnormal units (to nearest even), which land
  // in the low mantissa bits.
  constexpr std::uint32_t subnormal_magic =
      static_cast<std::uint32_t>(127 + 24 - Format::bias - m_bits) << 23;
  constexpr std::uint32_t overflow_code = kSaturation != Saturation::none ? Format::max_code
                                          : Format::has_infinity          ? Format::infinity_code
                                                                          : Format::nan_code;
  constexpr std::uint32_t infinity_code = kSaturation == Saturation::all ? Format::max_code
                                          : Format::has_infinity         ? Format::infinity_code
                                                                         : Format::nan_code;

  const std::uint32_t sign = (u >> 24) & 0x80u;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  const std::uint32_t normal = ((a + ((1u << (shift - 1)) - 1) + ((a >> shift) & 1u)) >> shift) -
                               (static_cast<std::uint32_t>(127 - Format::bias) << m_bits);
  const std::uint32_t subnormal =
      float_bits(bits_float(a) + bits_float(subnormal_magic)) - subnormal_magic;
  // Every quantity compared fits in 31 bits: compare as signed, which SIMD units do natively.
  const auto magnitude = static_cast<std::int32_t>(a);
  std::int32_t code = static_cast<std::int32_t>(
      select(magnitude < static_cast<std::int32_t>(min_normal_bits), subnormal, normal));
  // overflow_code is max_code or the code just above it, so a min maps every finite overflow
  // (and inf and NaN, whose codes come out above max_code) to it.
  code = std::min(code, static_cast<std::int32_t>(overflow_code));
  if constexpr (infinity_code != overflow_code) {
    code = static_cast<std::int32_t>(select(magnitude == static_cast<std::int32_t>(inf_bits),
                                            infinity_code, static_cast<std::uint32_t>(code)));
  }
  if constexpr (Format::nan_code != overflow_code) {
    code = static_cast<std::int32_t>(select(magnitude > static_cast<std::int32_t>(inf_bits),
                                            Format::nan_code, static_cast<std::uint32_t>(code)));
  }
  return static_cast<std::uint8_t>(sign | code);
}

template <typename Format>
inline std::uint8_t encode(float x, Saturation saturation) {
  switch (saturation) {
    case Saturation::none:
      return encode_bits<Format, Saturation::none>(float_bits(x));
    case Saturation::finite:
      return encode_bits<Format, Saturation::finite>(float_bits(x));
    case Saturation::all:
      return encode_bits<Format, Saturation::all>(float_bits(x));
  }
  return Format::nan_code;
}

// Encodes n fp32 or bf16 values; one loop per saturation mode so that each one vectorizes.
template <typename Format, Saturation kSaturation, typename From>
inline void encode_buffer(const From* in, std::uint8_t* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    out[i] = encode_bits<Format, kSaturation>(float_bits(static_cast<float>(in[i])));
  }
}

// Shared body of the two fp8 scalar types.
template <typename Derived, typename Format>
class Fp8Base {
 public:
  using format = Format;
  static constexpr Derived from_bits(std::uint8_t bits) {
    Derived d;
    d.bits_ = bits;
    return d;
  }
  constexpr std::uint8_t bits() const { return bits_; }
  explicit operator float() const { return decode_table<Format>()[bits_]; }
  friend constexpr bool operator==(Derived a, Derived b) { return a.bits_ == b.bits_; }
  friend constexpr bool operator!=(Derived a, Derived b) { return a.bits_ != b.bits_; }

 protected:
  std::uint8_t bits_ = 0;
};

}  // namespace detail

// OCP float8 E4M3FN: bias 7, max 448, no infinities, NaN = 0x7F / 0xFF. Bit-exact with
// ml_dtypes.float8_e4m3fn. Equality compares encodings (so NaN == NaN and +0 != -0).
class float8_e4m3fn : public detail::Fp8Base<float8_e4m3fn, detail::E4M3FnFormat> {
 public:
  float8_e4m3fn() = default;
  explicit float8_e4m3fn(float x) { bits_ = detail::encode<format>(x, Saturation::none); }
};

// OCP float8 E5M2: bias 15, max 57344, inf 0x7C / 0xFC, NaN S.11111.{01,10,11}. Bit-exact with
// ml_dtypes.float8_e5m2. Equality compares encodings.
class float8_e5m2 : public detail::Fp8Base<float8_e5m2, detail::E5M2Format> {
 public:
  float8_e5m2() = default;
  explicit float8_e5m2(float x) { bits_ = detail::encode<format>(x, Saturation::none); }
};

// fp32 -> fp8 with round-to-nearest-even and the chosen overflow behaviour.
template <typename T>
inline T fp8_cast(float x, Saturation saturation) {
  return T::from_bits(detail::encode<typename T::format>(x, saturation));
}

// Converts n fp32 or bf16 values to fp8 (T), exactly as fp8_cast does element by element. The
// loop is branch-free and vectorizes; use it for whole buffers.
template <typename T, typename From>
inline void fp8_encode(const From* in, T* out, std::int64_t n, Saturation saturation) {
  static_assert(sizeof(T) == 1 && std::is_trivially_copyable_v<T>, "T must be an fp8 type");
  static_assert(std::is_same_v<From, float> || std::is_same_v<From, Eigen::bfloat16>,
                "fp8_encode reads fp32 or bf16");
  using Format = typename T::format;
  auto* bytes = reinterpret_cast<std::uint8_t*>(out);
  switch (saturation) {
    case Saturation::none:
      return detail::encode_buffer<Format, Saturation::none>(in, bytes, n);
    case Saturation::finite:
      return detail::encode_buffer<Format, Saturation::finite>(in, bytes, n);
    case Saturation::all:
      return detail::encode_buffer<Format, Saturation::all>(in, bytes, n);
  }
}

// Exact fp32 values of n fp8 codes, by table lookup.
template <typename T>
inline void fp8_decode(const T* in, float* out, std::int64_t n) {
  const auto& table = detail::decode_table<typename T::format>();
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(in);
  for (std::int64_t i = 0; i < n; ++i) out[i] = table[bytes[i]];
}

// Exact bf16 values of n fp8 codes (every fp8 value is a bf16 value), by table lookup.
template <typename T>
inline void fp8_decode(const T* in, Eigen::bfloat16* out, std::int64_t n) {
  const auto& table = detail::decode_table_bf16<typename T::format>();
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(in);
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = Eigen::numext::bit_cast<Eigen::bfloat16>(table[bytes[i]]);
}

}  // namespace gmm

namespace gmm::detail {

// std::numeric_limits body shared by the two fp8 types.
template <typename T, typename Format>
struct Fp8NumericLimits {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = Format::has_infinity;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = false;
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  static constexpr bool is_iec559 = false;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = Format::mantissa_bits + 1;
  static constexpr int digits10 = 0;
  static constexpr int max_digits10 = Format::mantissa_bits == 3 ? 3 : 2;
  static constexpr int radix = 2;
  static constexpr int min_exponent = 2 - Format::bias;
  static constexpr int min_exponent10 = Format::mantissa_bits == 3 ? -1 : -4;
  static constexpr int max_exponent = Format::mantissa_bits == 3 ? 9 : 16;
  static constexpr int max_exponent10 = Format::mantissa_bits == 3 ? 2 : 4;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;
  static constexpr T min() { return T::from_bits(1 << Format::mantissa_bits); }
  static constexpr T lowest() { return T::from_bits(0x80 | Format::max_code); }
  static constexpr T max() { return T::from_bits(Format::max_code); }
  static constexpr T epsilon() {
    return T::from_bits(
        static_cast<std::uint8_t>((Format::bias - Format::mantissa_bits) << Format::mantissa_bits));
  }
  static constexpr T round_error() {
    return T::from_bits(static_cast<std::uint8_t>((Format::bias - 1) << Format::mantissa_bits));
  }
  static constexpr T infinity() {
    return T::from_bits(Format::has_infinity ? Format::infinity_code : Format::nan_code);
  }
  static constexpr T quiet_NaN() { return T::from_bits(Format::nan_code); }
  static constexpr T signaling_NaN() { return T::from_bits(Format::nan_code); }
  static constexpr T denorm_min() { return T::from_bits(1); }
};

}  // namespace gmm::detail

namespace std {

template <>
struct numeric_limits<gmm::float8_e4m3fn>
    : gmm::detail::Fp8NumericLimits<gmm::float8_e4m3fn, gmm::detail::E4M3FnFormat> {};
template <>
struct numeric_limits<gmm::float8_e5m2>
    : gmm::detail::Fp8NumericLimits<gmm::float8_e5m2, gmm::detail::E5M2Format> {};

}  // namespace std

namespace Eigen {

// Eigen::NumTraits body shared by the two fp8 types, so Eigen matrices of fp8 work.
template <typename T>
struct GmmFp8NumTraits : GenericNumTraits<T> {
  enum {
    IsSigned = 1,
    IsInteger = 0,
    IsComplex = 0,
    RequireInitialization = 0,
    ReadCost = 1,
    AddCost = 1,
    MulCost = 1
  };
  static T epsilon() { return std::numeric_limits<T>::epsilon(); }
  static T dummy_precision() { return std::numeric_limits<T>::epsilon(); }
  static T highest() { return std::numeric_limits<T>::max(); }
  static T lowest() { return std::numeric_limits<T>::lowest(); }
  static T infinity() { return std::numeric_limits<T>::infinity(); }
  static T quiet_NaN() { return std::numeric_limits<T>::quiet_NaN(); }
};

template <>
struct NumTraits<gmm::float8_e4m3fn> : GmmFp8NumTraits<gmm::float8_e4m3fn> {};
template <>
struct NumTraits<gmm::float8_e5m2> : GmmFp8NumTraits<gmm::float8_e5m2> {};

}  // namespace Eigen
