// Plans: which kernel family (v1 or v2) runs each pass (fwd, dlhs, drhs) of an expert layer.
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gmm/core/error.hpp"
#include "gmm/core/options.hpp"

namespace gmm {

// The three passes of an expert layer y = gmm(x, w): the forward product, the gradient of the
// activations (dlhs: dx = gmm(dy, w, transpose_rhs)) and of the weights (drhs: dw = tgmm(x, dy)).
enum class Pass : std::uint8_t { fwd, dlhs, drhs };

inline constexpr std::array<Pass, 3> all_passes = {Pass::fwd, Pass::dlhs, Pass::drhs};

constexpr std::string_view name(Pass p) {
  return p == Pass::fwd ? "fwd" : p == Pass::dlhs ? "dlhs" : "drhs";
}

// What the auto plan looks at to pick a family for one pass. `k` and `n` are the layer's
// (x [rows, k], w [groups, k, n]) whatever the pass; `rows` counts the rows local groups own.
struct PassShape {
  std::int64_t groups = 1;
  std::int64_t rows = 0;
  std::int64_t k = 0;
  std::int64_t n = 0;
  bool quantized = false;  // the pass multiplies at least one quantized (fp8 / int8) operand
};

// The auto plan's rule, with every threshold in this one place. For pass p, v1 runs when the
// mean number of rows per local group is at most v1_max_rows_per_group[p][quantized] and the
// layer is at least v1_min_k wide in K and v1_min_n in N; v2 runs otherwise. The defaults never
// pick v1 (a negative row bound): v2 fuses activation quantization into the kernel and follows
// group boundaries without padding, so it is not expected to lose anywhere, and no benchmark
// has yet shown a shape where v1 is faster. The benchmark report (bench/) is the evidence that
// moves these numbers.
struct AutoThresholds {
  double v1_max_rows_per_group[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};
  std::int64_t v1_min_k = 0;
  std::int64_t v1_min_n = 0;
};

inline constexpr AutoThresholds auto_thresholds{};

// The family the auto plan runs `pass` with on `shape` (a rule on the shape, not a timing run).
inline Family auto_family(Pass pass, const PassShape& shape,
                          const AutoThresholds& thresholds = auto_thresholds) {
  const double rows_per_group =
      static_cast<double>(shape.rows) / static_cast<double>(shape.groups > 0 ? shape.groups : 1);
  const double bound =
      thresholds.v1_max_rows_per_group[static_cast<int>(pass)][shape.quantized ? 1 : 0];
  const bool v1 =
      rows_per_group <= bound && shape.k >= thresholds.v1_min_k && shape.n >= thresholds.v1_min_n;
  return v1 ? Family::v1 : Family::v2;
}

// A per-pass choice of kernel family {fwd, dlhs, drhs}; an empty choice means "auto" (picked
// per shape by auto_family). All 8 fixed combinations are valid on a CPU: both families take
// every operand layout, group pattern and quantization of every pass, and compute the same
// values to fp32 summation error, so a plan only changes speed.
//
// Text form (parse and fmt): "v1" (v1,v1,v1), "v2" (v2,v2,v2, the one-word all-v2 switch),
// "hybrid" (v2,v1,v2: fused forward and weight gradient, Megablox-style dlhs), "auto", or three
// comma-separated choices among v1, v2 and auto in pass order, e.g. "v2,v2,v1". Printing gives
// the preset name when the plan is a preset and the triple otherwise, so
// Plan::parse(fmt::format("{}", plan)) == plan for every plan, and printing a parsed canonical
// string gives it back ("v2,v1,v2" parses to the hybrid plan and prints as "hybrid").
struct Plan {
  std::optional<Family> fwd = Family::v2;
  std::optional<Family> dlhs = Family::v1;
  std::optional<Family> drhs = Family::v2;

  static Plan v1() { return {Family::v1, Family::v1, Family::v1}; }
  static Plan v2() { return {Family::v2, Family::v2, Family::v2}; }
  static Plan hybrid() { return {Family::v2, Family::v1, Family::v2}; }
  static Plan automatic() { return {std::nullopt, std::nullopt, std::nullopt}; }
  // The one-word switch of MaxText's use_gmm_v2: all passes v2, or all v1.
  static Plan all_v2(bool use_v2) { return use_v2 ? v2() : v1(); }

  std::optional<Family> choice(Pass pass) const {
    return pass == Pass::fwd ? fwd : pass == Pass::dlhs ? dlhs : drhs;
  }

  // The family that runs `pass` on `shape`.
  Family family(Pass pass, const PassShape& shape) const {
    const std::optional<Family> chosen = choice(pass);
    return chosen ? *chosen : auto_family(pass, shape);
  }

  static Plan parse(std::string_view text) {
    if (text == "v1") return v1();
    if (text == "v2") return v2();
    if (text == "hybrid") return hybrid();
    if (text == "auto") return automatic();
    Plan plan;
    std::string_view rest = text;
    for (Pass pass : all_passes) {
      const std::size_t comma = rest.find(',');
      const bool last = pass == Pass::drhs;
      if (last != (comma == std::string_view::npos)) fail_parse(text);
      const std::string_view word = rest.substr(0, comma);
      std::optional<Family> chosen;
      if (word == "v1") {
        chosen = Family::v1;
      } else if (word == "v2") {
        chosen = Family::v2;
      } else if (word != "auto") {
        fail_parse(text);
      }
      (pass == Pass::fwd ? plan.fwd : pass == Pass::dlhs ? plan.dlhs : plan.drhs) = chosen;
      rest = last ? std::string_view() : rest.substr(comma + 1);
    }
    return plan;
  }

  std::string to_string() const {
    if (*this == v1()) return "v1";
    if (*this == v2()) return "v2";
    if (*this == hybrid()) return "hybrid";
    if (*this == automatic()) return "auto";
    auto word = [](std::optional<Family> f) { return f ? name(*f) : std::string_view("auto"); };
    return fmt::format("{},{},{}", word(fwd), word(dlhs), word(drhs));
  }

  friend bool operator==(const Plan& a, const Plan& b) {
    return a.fwd == b.fwd && a.dlhs == b.dlhs && a.drhs == b.drhs;
  }
  friend bool operator!=(const Plan& a, const Plan& b) { return !(a == b); }

 private:
  [[noreturn]] static void fail_parse(std::string_view text) {
    detail::fail("gmm::Plan::parse", "plan",
                 "\"v1\", \"v2\", \"hybrid\", \"auto\" or three of v1/v2/auto separated by "
                 "commas (fwd,dlhs,drhs), e.g. \"v2,v1,v2\"",
                 fmt::format("\"{}\"", text));
  }
};

}  // namespace gmm

template <>
struct fmt::formatter<gmm::Plan> : fmt::formatter<std::string_view> {
  auto format(const gmm::Plan& plan, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(plan.to_string(), ctx);
  }
};
template <>
struct fmt::formatter<gmm::Pass> : fmt::formatter<std::string_view> {
  auto format(gmm::Pass pass, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(gmm::name(pass), ctx);
  }
};
