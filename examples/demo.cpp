// Demo: one small grouped matmul through the fp64 reference (replaced by the trainer demo).
#include <gmm/gmm.hpp>

#include <cstdio>
#include <vector>

int main() {
  std::vector<float> x = {1, 2, 3, 4, 5, 6};     // [3, 2]
  std::vector<float> w = {1, 0, 0, 1, 2, 0, 0, 2};  // [2, 2, 2]
  std::vector<float> y(6);
  std::vector<std::int32_t> sizes = {1, 2};
  gmm::ref::gmm(gmm::view(x.data(), 3, 2), gmm::grouped_view(w.data(), 2, 2, 2), sizes,
                gmm::out_view(y.data(), 3, 2));
  for (int r = 0; r < 3; ++r) std::printf("%g %g\n", y[2 * r], y[2 * r + 1]);
}
