// Reader of the golden vector files in tests/data (written by tools/make_golden.py).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace gmm::test {

// The whitespace-separated fields of every non-comment line of tests/data/<file>.
inline std::vector<std::vector<std::string>> golden_records(const std::string& file) {
  const std::string path = std::string(GMM_TEST_DATA_DIR) + "/" + file;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::vector<std::vector<std::string>> records;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::vector<std::string> record;
    for (std::string field; fields >> field;) record.push_back(field);
    records.push_back(std::move(record));
  }
  EXPECT_FALSE(records.empty()) << path << " has no records";
  return records;
}

inline std::uint32_t bits32(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float from_bits32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline std::uint32_t parse_hex(const std::string& text) {
  return static_cast<std::uint32_t>(std::stoul(text, nullptr, 16));
}

// A run of hex digits as big-endian words of `bytes` bytes each (1, 2 or 4).
inline std::vector<std::uint32_t> parse_hex_words(const std::string& text, int bytes) {
  const std::size_t width = 2 * static_cast<std::size_t>(bytes);
  EXPECT_EQ(text.size() % width, 0u);
  std::vector<std::uint32_t> words(text.size() / width);
  for (std::size_t i = 0; i < words.size(); ++i) {
    words[i] = parse_hex(text.substr(i * width, width));
  }
  return words;
}

}  // namespace gmm::test
