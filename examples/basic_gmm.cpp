// Basic use of gmm::gmm with Eigen matrices: a grouped matmul in f32, then with fp8 weights and
// activations, each compared with the fp64 reference (the README's usage example).
#include <cstdio>
#include <gmm/gmm.hpp>
#include <vector>

int main() {
  using Mat = gmm::RowMajorMatrix<float>;
  Mat x = Mat::Random(96, 64);      // 96 tokens, K = 64
  Mat w = Mat::Random(4 * 64, 32);  // 4 experts, each [K = 64, N = 32], stacked
  Mat y(96, 32), exact(96, 32);
  std::vector<std::int32_t> sizes = {40, 0, 50, 6};  // tokens per expert, rows sorted by expert

  gmm::Options options;
  options.family = gmm::Family::v2;  // fused kernels (v1: Megablox-style)
  gmm::gmm(gmm::view(x), gmm::grouped_view(w, 4), sizes, gmm::out_view(y), options);
  gmm::ref::gmm(gmm::view(x), gmm::grouped_view(w, 4), sizes, gmm::out_view(exact));
  std::printf("f32: max |y - fp64 reference| = %.3g\n", (y - exact).cwiseAbs().maxCoeff());

  // fp8: per-channel e4m3fn weights (one scale per expert and column), activations quantized
  // inside the kernel with one scale per row and block of 512 along K (here all of K = 64).
  const gmm::QArray wq = gmm::quantize(gmm::grouped_view(w, 4), gmm::QType::float8_e4m3fn,
                                       gmm::BlockShape{1, 64, 1}, gmm::Calibration::absmax());
  options.quantize_lhs = gmm::QuantSpec{gmm::QType::float8_e4m3fn, gmm::Calibration::absmax(), 512};
  Mat y8(96, 32);
  gmm::gmm(gmm::view(x), wq.grouped(), sizes, gmm::out_view(y8), options);
  std::printf("fp8: relative L2 error vs f32 = %.4f\n", (y8 - y).norm() / y.norm());
  return 0;
}
