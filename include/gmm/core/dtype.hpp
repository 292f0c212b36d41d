// Element types gmm understands (DType), quantized types (QType) and their properties.
#pragma once

#include <fmt/format.h>

#include <Eigen/Core>
#include <cstdint>
#include <string_view>

#include "gmm/core/fp8.hpp"

namespace gmm {

using bfloat16 = Eigen::bfloat16;

// Element type of a type-erased view; the front end de-templatizes on it (ruy's watershed).
enum class DType : std::uint8_t { f32, bf16, float8_e4m3fn, float8_e5m2, int8 };

// Storage type of a quantized operand: one byte per value, fp32 scales beside it.
enum class QType : std::uint8_t { float8_e4m3fn, float8_e5m2, int8 };

constexpr DType dtype_of(QType q) {
  switch (q) {
    case QType::float8_e4m3fn:
      return DType::float8_e4m3fn;
    case QType::float8_e5m2:
      return DType::float8_e5m2;
    case QType::int8:
      return DType::int8;
  }
  return DType::int8;
}

constexpr bool is_quantized(DType d) { return d != DType::f32 && d != DType::bf16; }

constexpr QType qtype_of(DType d) {
  return d == DType::float8_e4m3fn ? QType::float8_e4m3fn
         : d == DType::float8_e5m2 ? QType::float8_e5m2
                                   : QType::int8;
}

// Largest magnitude a quantized value may take: the clip bound of calibration.
constexpr float qmax(QType q) {
  switch (q) {
    case QType::float8_e4m3fn:
      return 448.0f;
    case QType::float8_e5m2:
      return 57344.0f;
    case QType::int8:
      return 127.0f;
  }
  return 0.0f;
}

constexpr std::size_t size_of(DType d) { return d == DType::f32 ? 4 : d == DType::bf16 ? 2 : 1; }

constexpr std::string_view name(DType d) {
  switch (d) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::float8_e4m3fn:
      return "float8_e4m3fn";
    case DType::float8_e5m2:
      return "float8_e5m2";
    case DType::int8:
      return "int8";
  }
  return "?";
}

constexpr std::string_view name(QType q) { return name(dtype_of(q)); }

// DType of a C++ element type, for the typed view constructors.
template <typename T>
struct dtype_for;
template <>
struct dtype_for<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_for<bfloat16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_for<float8_e4m3fn> {
  static constexpr DType value = DType::float8_e4m3fn;
};
template <>
struct dtype_for<float8_e5m2> {
  static constexpr DType value = DType::float8_e5m2;
};
template <>
struct dtype_for<std::int8_t> {
  static constexpr DType value = DType::int8;
};

// Exact value of one stored element, whatever its DType (slow path: reference and tests).
inline float load_as_float(const void* base, DType d, std::int64_t index) {
  switch (d) {
    case DType::f32:
      return static_cast<const float*>(base)[index];
    case DType::bf16:
      return static_cast<float>(static_cast<const bfloat16*>(base)[index]);
    case DType::float8_e4m3fn:
      return static_cast<float>(static_cast<const float8_e4m3fn*>(base)[index]);
    case DType::float8_e5m2:
      return static_cast<float>(static_cast<const float8_e5m2*>(base)[index]);
    case DType::int8:
      return static_cast<float>(static_cast<const std::int8_t*>(base)[index]);
  }
  return 0.0f;
}

}  // namespace gmm

template <>
struct fmt::formatter<gmm::DType> : fmt::formatter<std::string_view> {
  auto format(gmm::DType d, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(gmm::name(d), ctx);
  }
};
template <>
struct fmt::formatter<gmm::QType> : fmt::formatter<std::string_view> {
  auto format(gmm::QType q, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(gmm::name(q), ctx);
  }
};
