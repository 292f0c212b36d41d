// Calibration: how a quantization scale is chosen (Qwix "absmax" or "fixed,MAX" /
// "fixed,-MAX,MAX").
#pragma once

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>

#include "gmm/core/dtype.hpp"
#include "gmm/core/error.hpp"

namespace gmm {

// The scale rule of one quantized operand. absmax: scale = max|x| over the scale block / qmax,
// dynamic. fixed: a static per-tensor scale = bound / qmax, known before the data is seen.
struct Calibration {
  enum class Method : std::uint8_t { absmax, fixed };
  Method method = Method::absmax;
  float bound = 0.0f;  // fixed only: the symmetric bound MAX

  static Calibration absmax() { return {}; }

  static Calibration fixed(float max) {
    detail::require(std::isfinite(max) && max > 0.0f, "gmm::Calibration::fixed", "MAX",
                    "a finite positive bound", max);
    return {Method::fixed, max};
  }

  // Parses Qwix calibration strings: "absmax", "fixed,MAX" or "fixed,-MAX,MAX".
  static Calibration parse(std::string_view text) {
    constexpr const char* where = "gmm::Calibration::parse";
    constexpr std::string_view syntax = "\"absmax\", \"fixed,MAX\" or \"fixed,-MAX,MAX\"";
    if (text == "absmax") return absmax();
    if (text.substr(0, 6) != "fixed,") detail::fail(where, "calibration", syntax, text);
    std::string_view rest = text.substr(6);
    const auto comma = rest.find(',');
    if (comma == std::string_view::npos) return fixed(parse_bound(rest, text));
    const float low = parse_bound(rest.substr(0, comma), text);
    const float high = parse_bound(rest.substr(comma + 1), text);
    detail::require(low == -high, where, "fixed bounds", "symmetric bounds -MAX,MAX", text);
    return fixed(high);
  }

  // Per-tensor scale of fixed calibration, refused when below sqrt(FLT_MIN).
  float static_scale(QType qtype) const {
    const float scale = bound / qmax(qtype);
    detail::require(scale >= std::sqrt(std::numeric_limits<float>::min()),
                    "gmm::Calibration::static_scale", "fixed scale MAX / qmax",
                    "at least sqrt(FLT_MIN)", scale);
    return scale;
  }

  std::string to_string() const {
    return method == Method::absmax ? std::string("absmax") : fmt::format("fixed,{}", bound);
  }

 private:
  // A number and nothing else: strtof would skip leading blanks, which the syntax has nowhere.
  static float parse_bound(std::string_view field, std::string_view text) {
    const std::string s(field);
    const bool starts_as_number = !s.empty() && !std::isspace(static_cast<unsigned char>(s[0]));
    char* end = nullptr;
    const float v = starts_as_number ? std::strtof(s.c_str(), &end) : NAN;
    detail::require(starts_as_number && end == s.c_str() + s.size() && std::isfinite(v),
                    "gmm::Calibration::parse", "fixed bound", "a finite number", text);
    return v;
  }
};

}  // namespace gmm
