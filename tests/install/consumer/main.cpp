// Uses the installed headers: quantizes a value and runs the fp64 reference on one group.
#include <cstdio>
#include <gmm/gmm.hpp>
#include <vector>

int main() {
  if (gmm::float8_e4m3fn(464.0f).bits() != 0x7E) return 1;  // 464 ties to even: 448
  std::vector<float> lhs = {1, 2, 3, 4};                    // [2, 2]
  std::vector<float> rhs = {1, 0, 0, 1};                    // [1, 2, 2] identity
  std::vector<float> out(4, -1.0f);
  std::vector<std::int32_t> sizes = {2};
  gmm::ref::gmm(gmm::view(lhs.data(), 2, 2), gmm::grouped_view(rhs.data(), 1, 2, 2), sizes,
                gmm::out_view(out.data(), 2, 2));
  for (int i = 0; i < 4; ++i) {
    if (out[i] != lhs[i]) return 2;
  }
  std::puts("gmm consumer ok");
  return 0;
}
