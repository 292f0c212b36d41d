// Error reporting: gmm::Error and the argument checks every entry point runs before writing.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace gmm {

// Thrown for invalid input. The message names the function, the argument, the expected and
// the actual value. When a call throws, none of its outputs has been written.
class Error : public std::invalid_argument {
 public:
  explicit Error(const std::string& what) : std::invalid_argument(what) {}
};

namespace detail {

// Throws gmm::Error("<where>: <argument>: expected <expected>, got <actual>").
template <typename Actual>
[[noreturn]] inline void fail(const char* where, std::string_view argument,
                              std::string_view expected, const Actual& actual) {
  throw Error(fmt::format("{}: {}: expected {}, got {}", where, argument, expected, actual));
}

template <typename Actual>
inline void require(bool ok, const char* where, std::string_view argument,
                    std::string_view expected, const Actual& actual) {
  if (!ok) fail(where, argument, expected, actual);
}

}  // namespace detail
}  // namespace gmm
