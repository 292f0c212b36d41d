// The element rules of Qwix quantization: absmax scale with zero guard, clip, divide, RNE cast.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "gmm/core/dtype.hpp"
#include "gmm/core/fp8.hpp"

namespace gmm::detail {

// NaN-propagating running max of |x| (a NaN anywhere in a block makes its scale NaN, as
// jnp.max does in Qwix).
inline float absmax_update(float running, float x) {
  const float a = std::fabs(x);
  return (a > running || a != a) ? a : running;
}

// scale = absmax / qmax in fp32; a scale below sqrt(FLT_MIN) becomes 1 (Qwix's zero guard).
inline float absmax_scale(float absmax, QType qtype) {
  const float scale = absmax / qmax(qtype);
  return scale < std::sqrt(std::numeric_limits<float>::min()) ? 1.0f : scale;
}

// q = cast(clip(x / scale, -qmax, qmax)): a division (not a reciprocal multiply) so results
// match Qwix bit for bit; fp8 rounds to nearest even, int8 rounds half to even. Returns the
// stored byte (int8 as two's complement; NaN stores 0 there).
inline std::uint8_t quantize_value(float x, float scale, QType qtype) {
  const float bound = qmax(qtype);
  float q = x / scale;
  q = q > bound ? bound : (q < -bound ? -bound : q);  // NaN passes through
  switch (qtype) {
    case QType::float8_e4m3fn:
      return encode<E4M3FnFormat>(q, Saturation::none);
    case QType::float8_e5m2:
      return encode<E5M2Format>(q, Saturation::none);
    case QType::int8:  // integers have no NaN: a NaN input stores 0
      return q != q ? 0 : static_cast<std::uint8_t>(static_cast<std::int8_t>(std::nearbyint(q)));
  }
  return 0;
}

// Exact value of a stored quantized byte.
inline float dequantize_value(std::uint8_t stored, QType qtype) {
  switch (qtype) {
    case QType::float8_e4m3fn:
      return decode_table<E4M3FnFormat>()[stored];
    case QType::float8_e5m2:
      return decode_table<E5M2Format>()[stored];
    case QType::int8:
      return static_cast<float>(static_cast<std::int8_t>(stored));
  }
  return 0.0f;
}

}  // namespace gmm::detail
