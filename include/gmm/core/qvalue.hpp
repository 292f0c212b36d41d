// The element rules of Qwix quantization: absmax scale with zero guard, clip, divide, RNE cast.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "gmm/core/dtype.hpp"
#include "gmm/core/fp8.hpp"

namespace gmm::detail {

// NaN-propagating running max of |x| (a NaN anywhere in a block makes its scale NaN, as
// jnp.max does in Qwix). Computed on bit patterns: for non-negative floats the integer order is
// the numeric order and every NaN lies above inf, so an integer max propagates NaN without a
// branch. `running` starts at 0.
inline float absmax_update(float running, float x) {
  const std::uint32_t a = float_bits(x) & 0x7FFFFFFFu;
  const std::uint32_t r = float_bits(running);
  return bits_float(a > r ? a : r);
}

// absmax_update over n consecutive fp32 or bf16 values; vectorizes.
template <typename From>
inline float absmax_update(float running, const From* x, std::int64_t n) {
  std::uint32_t r = float_bits(running);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t a = float_bits(static_cast<float>(x[i])) & 0x7FFFFFFFu;
    r = a > r ? a : r;
  }
  return bits_float(r);
}

// scale = absmax / qmax in fp32; a scale below sqrt(FLT_MIN) becomes 1 (Qwix's zero guard).
inline float absmax_scale(float absmax, QType qtype) {
  const float scale = absmax / qmax(qtype);
  return scale < std::sqrt(std::numeric_limits<float>::min()) ? 1.0f : scale;
}

// q = cast(clip(x / scale, -qmax, qmax)): a division (not a reciprocal multiply) so results
// match Qwix bit for bit; fp8 rounds to nearest even, int8 rounds half to even. Returns the
// stored byte (int8 as two's complement; NaN stores 0 there). Branch-free integer work after the
// division, so loops over a block vectorize.
template <QType kQType>
inline std::uint8_t quantize_value(float x, float scale) {
  const std::uint32_t q = float_bits(x / scale);
  if constexpr (kQType == QType::float8_e4m3fn) {
    // qmax is the format's max, so clipping to +-qmax and then rounding is exactly the
    // saturating cast that also clamps infinities (Saturation::all); NaN stays NaN.
    return encode_bits<E4M3FnFormat, Saturation::all>(q);
  } else if constexpr (kQType == QType::float8_e5m2) {
    return encode_bits<E5M2Format, Saturation::all>(q);
  } else {
    // Clip |q| to 127 on the bit pattern (integer order is numeric order for magnitudes), then
    // add 1.5 * 2^23, whose ulp is 1: the sum's low mantissa bits are q rounded to the nearest
    // even integer. Integers have no NaN: a NaN stores 0.
    constexpr std::uint32_t kBound = 0x42FE0000u;  // 127.0f
    constexpr float kRounder = 12582912.0f;
    const std::uint32_t magnitude = q & 0x7FFFFFFFu;
    const float clipped =
        bits_float((q & 0x80000000u) | select(magnitude > kBound, kBound, magnitude));
    const std::uint32_t rounded = float_bits(clipped + kRounder) - float_bits(kRounder);
    return static_cast<std::uint8_t>(select(magnitude > 0x7F800000u, 0u, rounded));
  }
}

inline std::uint8_t quantize_value(float x, float scale, QType qtype) {
  switch (qtype) {
    case QType::float8_e4m3fn:
      return quantize_value<QType::float8_e4m3fn>(x, scale);
    case QType::float8_e5m2:
      return quantize_value<QType::float8_e5m2>(x, scale);
    case QType::int8:
      return quantize_value<QType::int8>(x, scale);
  }
  return 0;
}

// Exact value of a stored quantized byte.
template <QType kQType>
inline float dequantize_value(std::uint8_t stored) {
  if constexpr (kQType == QType::float8_e4m3fn) {
    return decode_table<E4M3FnFormat>()[stored];
  } else if constexpr (kQType == QType::float8_e5m2) {
    return decode_table<E5M2Format>()[stored];
  } else {
    return static_cast<float>(static_cast<std::int8_t>(stored));
  }
}

inline float dequantize_value(std::uint8_t stored, QType qtype) {
  switch (qtype) {
    case QType::float8_e4m3fn:
      return dequantize_value<QType::float8_e4m3fn>(stored);
    case QType::float8_e5m2:
      return dequantize_value<QType::float8_e5m2>(stored);
    case QType::int8:
      return dequantize_value<QType::int8>(stored);
  }
  return 0.0f;
}

}  // namespace gmm::detail
