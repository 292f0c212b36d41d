// expect_error: runs a call that must throw gmm::Error naming given parts in its message.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gmm/core/error.hpp"

namespace gmm::test {

// Runs `body`, expecting a gmm::Error whose message contains every one of `parts`.
template <typename Body>
void expect_error(Body&& body, const std::vector<std::string>& parts) {
  try {
    body();
    ADD_FAILURE() << "no gmm::Error thrown";
  } catch (const Error& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << part << "\"";
    }
  }
}

}  // namespace gmm::test
