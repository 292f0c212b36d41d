// Benchmark cases (pass x recipe x shape of design.md section 7), their group sizes and operands.
#pragma once

#include <cstddef>
#include <cstdint>
#include <gmm/gmm.hpp>
#include <gmm/plan.hpp>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gmm_bench {

using gmm::Pass;

// Operand precisions: fp32 and bf16 operands; fp8 = e4m3fn per-channel weights with per-row
// dynamic activations; fp8-block = 128x128 weights with 1x128 activations (DeepSeek-style);
// fp8-static = per-channel weights with a fixed (calibrated) per-tensor activation scale.
enum class Recipe { fp32, bf16, fp8, fp8_block, fp8_static };

std::string_view name(Recipe recipe);
bool is_fp8(Recipe recipe);

// How the routed rows are spread over the experts.
enum class GroupDistribution { multinomial, first_takes_all, one_each, zipf };

// One problem size: G experts, M routed rows, contraction K, output features N.
struct Shape {
  std::string name;
  std::int64_t groups, m, k, n;
  GroupDistribution distribution = GroupDistribution::multinomial;
};

// The shapes of a run. full: design.md section 7 exactly (--full-size; weights up to 7.5 GB per
// operand, up to 8x the default run's flops per shape). scaled (default): the same shapes with
// fewer experts and rows but the same K, N, rows per expert and group distribution, so the
// per-expert products and the weight streaming they exercise are those of the full shapes, in
// about 5 minutes. quick: two small shapes for CI smoke (--quick).
enum class ShapeSet { scaled, full, quick };
const std::vector<Shape>& shapes(ShapeSet set);
std::string_view name(ShapeSet set);
std::string describe(const Shape& shape);  // "G=.. M=.. K=.. N=.., <group distribution>"

// Seeded (fixed seed) group sizes of a shape: uniform multinomial, [M, 0...], [1...] or Zipf(1.2).
std::vector<std::int32_t> make_group_sizes(const Shape& shape);

// Settings shared by every benchmark of a run, fixed before registration.
struct RunConfig {
  int threads = 2;
  ShapeSet shape_set = ShapeSet::scaled;
  double memory_budget_bytes = 10e9;  // operands kept cached; least recently used are dropped
};
RunConfig& run_config();

// A cached operand: row-major [groups, rows, cols] values and, when quantized, fp32 scales.
struct Operand {
  gmm::DType dtype = gmm::DType::f32;
  std::int64_t groups = 1, rows = 0, cols = 0;
  std::shared_ptr<void> owner;  // keeps `data` and `scales` alive
  void* data = nullptr;
  const float* scales = nullptr;
  gmm::BlockShape block;
  std::size_t bytes = 0;

  gmm::Matrix matrix() const;
  gmm::GroupedMatrix grouped() const;
  gmm::OutMatrix out() const;
  gmm::OutGroupedMatrix out_grouped() const;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};
using OperandPtr = std::shared_ptr<const Operand>;

// The operands of a pass in one dense dtype: fwd x, w -> y; dlhs dy, w -> dx; drhs x, dy -> dw.
struct PassOperands {
  OperandPtr lhs, rhs, out;
  // The [G, K, N] operand (the weights, or the weight gradient for drhs), for weight GB/s.
  const Operand& weight_like(Pass pass) const { return pass == Pass::drhs ? *out : *rhs; }
};

// The data of one shape, created on first use and cached (values are uniform in [-1, 1) from a
// counter-based hash, so every dtype of an operand holds roundings of the same numbers). Asking
// for another shape's workload drops this one's operands.
class Workload {
 public:
  explicit Workload(const Shape& shape);
  const Shape& shape() const { return shape_; }
  const std::vector<std::int32_t>& group_sizes() const { return group_sizes_; }
  // First row of each group (group_offsets()[g] + group_sizes()[g] is one past its last row).
  const std::vector<std::int64_t>& group_offsets() const { return group_offsets_; }
  std::int64_t routed_rows() const { return routed_rows_; }
  std::int64_t active_groups() const { return active_groups_; }

  OperandPtr activations(gmm::DType dtype);        // x [M, K]
  OperandPtr output_gradient(gmm::DType dtype);    // dy [M, N]
  OperandPtr weights(gmm::DType dtype);            // w [G, K, N]
  OperandPtr fp8_weights(gmm::BlockShape block);   // e4m3fn w [G, K, N], gmm::quantize'd once
  OperandPtr output(Pass pass, gmm::DType dtype);  // y [M, N], dx [M, K] or dw [G, K, N]
  PassOperands operands(Pass pass, gmm::DType dtype);
  // A zeroed f32 scratch buffer [groups, rows, cols], for baselines.
  OperandPtr scratch(const std::string& tag, std::int64_t groups, std::int64_t rows,
                     std::int64_t cols);

 private:
  OperandPtr dense(const std::string& tag, gmm::DType dtype, std::int64_t groups, std::int64_t rows,
                   std::int64_t cols, std::uint64_t seed, bool zero);

  Shape shape_;
  std::vector<std::int32_t> group_sizes_;
  std::vector<std::int64_t> group_offsets_;
  std::int64_t routed_rows_ = 0;
  std::int64_t active_groups_ = 0;
};

// The workload of a shape (cached; the previous shape's operands are released).
Workload& workload(const Shape& shape);

// One benchmark case.
struct Case {
  Pass pass;
  Recipe recipe;
  const Shape* shape;
};

// Flops of a case: 2 * sum(group_sizes) * K * N.
double case_flops(const Workload& w);

// Dtype of the unquantized operands and of the outputs of a recipe: f32 for fp32, else bf16.
gmm::DType dense_dtype(Recipe recipe);

// Scale block of the stored e4m3fn weights [G, K, N] of a recipe and pass: per channel
// {1, K, 1} for fwd (one scale per output column), {1, 1, N} for dlhs (one scale per row of the
// stored weight, which is the output axis of dlhs), {1, 128, 128} blocks for fp8-block.
gmm::BlockShape weight_block(Recipe recipe, Pass pass, const Shape& shape);

// The in-call quantization of an activation or gradient operand of a recipe (e4m3fn): absmax per
// row (whole contraction) for fp8, blocks of 128 along the contraction for fp8-block, a fixed
// calibration (bound 1, the data range) for fp8-static.
gmm::QuantSpec activation_quantization(Recipe recipe, std::int64_t contraction);

// Block along the contraction used by fp8-block: 128, or the largest power of two dividing the
// extent when 128 does not (gptoss, K = N = 2880: 64).
std::int64_t fp8_block_extent(std::int64_t extent);

}  // namespace gmm_bench
