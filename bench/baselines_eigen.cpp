// Baselines on Eigen: a per-group loop of Eigen GEMMs (fp32), and the naive fp8 path (dequantize
// everything to f32, then the same loop).
#include <Eigen/Core>
#include <algorithm>
#include <gmm/core/quantize.hpp>
#include <type_traits>

#include "harness.hpp"

namespace gmm_bench {
namespace {

template <typename T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMatrix<float>>;

// out = product, [rows, cols]; a bf16 `out` gets the product evaluated into the f32 `scratch`
// (at least rows * cols) and rounded once.
template <typename Out, typename Product>
void assign(Out* out, std::int64_t rows, std::int64_t cols, const Product& product,
            float* scratch) {
  if constexpr (std::is_same_v<Out, float>) {
    Eigen::Map<RowMatrix<float>>(out, rows, cols).noalias() = product;
  } else {
    Eigen::Map<RowMatrix<float>> f32(scratch, rows, cols);
    f32.noalias() = product;
    Eigen::Map<RowMatrix<Out>>(out, rows, cols) = f32.template cast<Out>();
  }
}

// Elements of the largest per-group result of a pass (the f32 scratch of a bf16 output).
std::int64_t largest_result(Pass pass, const Workload& w) {
  if (pass == Pass::drhs) return w.shape().k * w.shape().n;
  const std::int32_t rows = *std::max_element(w.group_sizes().begin(), w.group_sizes().end());
  return rows * (pass == Pass::fwd ? w.shape().n : w.shape().k);
}

// One Eigen GEMM per group: fwd out_g = x_g w_g; dlhs out_g = dy_g w_g^T; drhs out_g = x_g^T dy_g
// (lhs is x or dy, rhs is w or dy, all f32; `scratch` as in assign for a bf16 output).
template <typename Out>
void eigen_grouped(Pass pass, const Workload& w, const float* lhs, const float* rhs, Out* out,
                   float* scratch = nullptr) {
  const std::int64_t k = w.shape().k, n = w.shape().n;
  for (std::int64_t g = 0; g < w.shape().groups; ++g) {
    const std::int64_t rows = w.group_sizes()[g], first = w.group_offsets()[g];
    if (pass == Pass::drhs && rows == 0) {
      Eigen::Map<RowMatrix<Out>>(out + g * k * n, k, n).setZero();
    } else if (pass == Pass::drhs) {
      assign(out + g * k * n, k, n,
             ConstMap(lhs + first * k, rows, k).transpose() * ConstMap(rhs + first * n, rows, n),
             scratch);
    } else if (rows > 0 && pass == Pass::fwd) {
      assign(out + first * n, rows, n,
             ConstMap(lhs + first * k, rows, k) * ConstMap(rhs + g * k * n, k, n), scratch);
    } else if (rows > 0) {
      assign(out + first * k, rows, k,
             ConstMap(lhs + first * n, rows, n) * ConstMap(rhs + g * k * n, k, n).transpose(),
             scratch);
    }
  }
}

void run_eigen(benchmark::State& state, const Case& c) {
  Workload& w = workload(*c.shape);
  Eigen::setNbThreads(run_config().threads);
  const PassOperands ops = w.operands(c.pass, gmm::DType::f32);
  const LoopTime time = time_calls(state, w, [&] {
    eigen_grouped(c.pass, w, ops.lhs->as<float>(), ops.rhs->as<float>(), ops.out->as<float>());
  });
  Eigen::setNbThreads(1);
  set_counters(state, c, w, time, weight_bytes(c, w, ops.weight_like(c.pass)), 0,
               run_config().threads);
}

// Scale block of an activation quantized like the recipe, with the contraction along its rows
// (tgmm) or its cols (gmm); a fixed calibration is per tensor whatever the block.
gmm::BlockShape activation_block(const gmm::QuantSpec& spec, bool contraction_along_rows) {
  return contraction_along_rows ? gmm::BlockShape{1, spec.block, 1}
                                : gmm::BlockShape{1, 1, spec.block};
}

// Quantize-dequantize of an activation into an f32 buffer; returns the bytes it allocated.
std::int64_t fake_quantize(const Operand& source, const gmm::QuantSpec& spec,
                           bool contraction_along_rows, const Operand& target) {
  const int threads = run_config().threads;
  const gmm::QArray q =
      gmm::quantize(source.matrix(), spec.qtype, activation_block(spec, contraction_along_rows),
                    spec.calibration, threads);
  gmm::dequantize(q.matrix(), target.out(), threads);
  return static_cast<std::int64_t>(q.qvalue.size() + sizeof(float) * q.scale.size());
}

void run_naive_fp8(benchmark::State& state, const Case& c) {
  Workload& w = workload(*c.shape);
  const Shape& s = *c.shape;
  Eigen::setNbThreads(run_config().threads);
  std::int64_t extra = 0;
  try {
    if (c.pass == Pass::drhs) {
      const gmm::QuantSpec spec = activation_quantization(c.recipe, s.m);
      const OperandPtr x = w.activations(gmm::DType::bf16);
      const OperandPtr dy = w.output_gradient(gmm::DType::bf16);
      const OperandPtr out = w.output(c.pass, gmm::DType::bf16);
      const OperandPtr xf = w.scratch("x", 1, s.m, s.k);
      const OperandPtr dyf = w.scratch("dy", 1, s.m, s.n);
      const OperandPtr product = w.scratch("product", 1, 1, largest_result(c.pass, w));
      const LoopTime time = time_calls(state, w, [&] {
        extra = fake_quantize(*x, spec, true, *xf) + fake_quantize(*dy, spec, true, *dyf);
        eigen_grouped(c.pass, w, xf->as<float>(), dyf->as<float>(), out->as<gmm::bfloat16>(),
                      product->as<float>());
      });
      extra += static_cast<std::int64_t>(xf->bytes + dyf->bytes + product->bytes);
      set_counters(state, c, w, time, weight_bytes(c, w, *out), extra, run_config().threads);
    } else {
      const bool fwd = c.pass == Pass::fwd;
      const OperandPtr lhs =
          fwd ? w.activations(gmm::DType::bf16) : w.output_gradient(gmm::DType::bf16);
      const gmm::QuantSpec spec = activation_quantization(c.recipe, lhs->cols);
      const OperandPtr weights = w.fp8_weights(weight_block(c.recipe, c.pass, s));
      const OperandPtr out = w.output(c.pass, gmm::DType::bf16);
      const OperandPtr lhsf = w.scratch("lhs", 1, lhs->rows, lhs->cols);
      const OperandPtr weightsf = w.scratch("w", s.groups, s.k, s.n);
      const OperandPtr product = w.scratch("product", 1, 1, largest_result(c.pass, w));
      const LoopTime time = time_calls(state, w, [&] {
        extra = fake_quantize(*lhs, spec, false, *lhsf);
        gmm::dequantize(weights->grouped(), weightsf->out_grouped(), run_config().threads);
        eigen_grouped(c.pass, w, lhsf->as<float>(), weightsf->as<float>(), out->as<gmm::bfloat16>(),
                      product->as<float>());
      });
      extra += static_cast<std::int64_t>(lhsf->bytes + weightsf->bytes + product->bytes);
      set_counters(state, c, w, time, weight_bytes(c, w, *weights), extra, run_config().threads);
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
  Eigen::setNbThreads(1);
}

}  // namespace

void register_eigen_baselines(const Case& c) {
  if (c.recipe == Recipe::fp32) {
    configure(benchmark::RegisterBenchmark(benchmark_name(c, "baseline-eigen").c_str(),
                                           [c](benchmark::State& state) { run_eigen(state, c); }));
  }
  if (is_fp8(c.recipe)) {
    configure(
        benchmark::RegisterBenchmark(benchmark_name(c, "baseline-naive-fp8").c_str(),
                                     [c](benchmark::State& state) { run_naive_fp8(state, c); }));
  }
}

}  // namespace gmm_bench
