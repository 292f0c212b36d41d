// Shapes, group sizes and the cached operands of the benchmark cases.
#include "workload.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <gmm/core/parallel.hpp>
#include <gmm/core/quantize.hpp>
#include <map>
#include <random>

namespace gmm_bench {

std::string_view name(Recipe recipe) {
  switch (recipe) {
    case Recipe::fp32:
      return "fp32";
    case Recipe::bf16:
      return "bf16";
    case Recipe::fp8:
      return "fp8";
    case Recipe::fp8_block:
      return "fp8-block";
    case Recipe::fp8_static:
      return "fp8-static";
  }
  return "?";
}

bool is_fp8(Recipe recipe) {
  return recipe == Recipe::fp8 || recipe == Recipe::fp8_block || recipe == Recipe::fp8_static;
}

const std::vector<Shape>& shapes(ShapeSet set) {
  using D = GroupDistribution;
  static const std::vector<Shape> full = {
      {"dsv3-up", 256, 4096, 7168, 1024, D::multinomial},
      {"dsv3-down", 256, 4096, 1024, 7168, D::multinomial},
      {"gptoss", 128, 8192, 2880, 2880, D::multinomial},
      {"qwen3-30b", 128, 8192, 2048, 768, D::multinomial},
      {"mixtral", 8, 2048, 4096, 14336, D::multinomial},
      {"mixtral-few", 8, 64, 4096, 14336, D::multinomial},
      {"compute-bound", 8, 4096, 4096, 4096, D::first_takes_all},
      {"decode", 8, 8, 4096, 4096, D::one_each},
      {"skewed", 64, 8192, 2048, 1408, D::zipf},
      {"skewed-uniform", 64, 8192, 2048, 1408, D::multinomial},
  };
  static const std::vector<Shape> scaled = {
      {"dsv3-up", 32, 512, 7168, 1024, D::multinomial},
      {"dsv3-down", 32, 512, 1024, 7168, D::multinomial},
      {"gptoss", 16, 1024, 2880, 2880, D::multinomial},
      {"qwen3-30b", 32, 2048, 2048, 768, D::multinomial},
      {"mixtral", 2, 512, 4096, 14336, D::multinomial},
      {"mixtral-few", 2, 16, 4096, 14336, D::multinomial},
      {"compute-bound", 8, 1024, 4096, 4096, D::first_takes_all},
      {"decode", 8, 8, 4096, 4096, D::one_each},
      {"skewed", 64, 2048, 2048, 1408, D::zipf},
      {"skewed-uniform", 64, 2048, 2048, 1408, D::multinomial},
  };
  static const std::vector<Shape> quick = {
      {"mini", 8, 512, 512, 256, D::multinomial},
      {"mini-decode", 8, 8, 1024, 512, D::one_each},
  };
  return set == ShapeSet::full ? full : set == ShapeSet::quick ? quick : scaled;
}

std::string_view name(ShapeSet set) {
  return set == ShapeSet::full    ? "full (design.md section 7)"
         : set == ShapeSet::quick ? "quick (CI smoke)"
                                  : "scaled (design.md section 7 with fewer experts and rows)";
}

std::string describe(const Shape& shape) {
  constexpr std::string_view distributions[] = {"uniform multinomial", "gs=[M, 0, ...]",
                                                "gs=[1, ...]", "Zipf(1.2)"};
  return fmt::format("G={} M={} K={} N={}, {}", shape.groups, shape.m, shape.k, shape.n,
                     distributions[static_cast<int>(shape.distribution)]);
}

std::vector<std::int32_t> make_group_sizes(const Shape& shape) {
  std::vector<std::int32_t> sizes(shape.groups, 0);
  std::mt19937_64 rng(0x5eed);
  const auto uniform01 = [&] { return static_cast<double>(rng() >> 11) * 0x1p-53; };
  switch (shape.distribution) {
    case GroupDistribution::multinomial:
      for (std::int64_t r = 0; r < shape.m; ++r) {
        ++sizes[static_cast<std::size_t>(uniform01() * static_cast<double>(shape.groups))];
      }
      break;
    case GroupDistribution::first_takes_all:
      sizes[0] = static_cast<std::int32_t>(shape.m);
      break;
    case GroupDistribution::one_each:
      std::fill(sizes.begin(), sizes.end(), static_cast<std::int32_t>(shape.m / shape.groups));
      break;
    case GroupDistribution::zipf: {
      constexpr double kExponent = 1.2;
      std::vector<double> cdf(shape.groups);
      double total = 0;
      for (std::int64_t g = 0; g < shape.groups; ++g) {
        total += std::pow(static_cast<double>(g + 1), -kExponent);
        cdf[g] = total;
      }
      for (std::int64_t r = 0; r < shape.m; ++r) {
        const auto it = std::upper_bound(cdf.begin(), cdf.end(), uniform01() * total);
        ++sizes[std::min<std::size_t>(it - cdf.begin(), cdf.size() - 1)];
      }
      break;
    }
  }
  return sizes;
}

RunConfig& run_config() {
  static RunConfig config;
  return config;
}

gmm::Matrix Operand::matrix() const { return {data, dtype, rows, cols, cols, {scales, block}}; }

gmm::GroupedMatrix Operand::grouped() const {
  return {data, dtype, groups, rows, cols, rows * cols, cols, {scales, block}};
}

gmm::OutMatrix Operand::out() const { return {data, dtype, rows, cols, cols}; }

gmm::OutGroupedMatrix Operand::out_grouped() const {
  return {data, dtype, groups, rows, cols, rows * cols, cols};
}

namespace {

// Operands of the current shape, dropped least recently used first beyond the memory budget.
class OperandCache {
 public:
  template <typename Make>
  OperandPtr get(const std::string& key, std::size_t bytes, Make&& make) {
    const auto found = entries_.find(key);
    if (found != entries_.end()) {
      found->second.last_use = ++clock_;
      return found->second.operand;
    }
    make_room(bytes);
    auto operand = std::make_shared<const Operand>(make());
    entries_[key] = {operand, ++clock_};
    return operand;
  }

  void clear() { entries_.clear(); }

 private:
  struct Entry {
    OperandPtr operand;
    std::uint64_t last_use = 0;
  };

  void make_room(std::size_t bytes) {
    for (;;) {
      double total = static_cast<double>(bytes);
      auto oldest = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        total += static_cast<double>(it->second.operand->bytes);
        const bool in_use = it->second.operand.use_count() > 1;
        if (!in_use &&
            (oldest == entries_.end() || it->second.last_use < oldest->second.last_use)) {
          oldest = it;
        }
      }
      if (total <= run_config().memory_budget_bytes || oldest == entries_.end()) return;
      entries_.erase(oldest);
    }
  }

  std::map<std::string, Entry> entries_;
  std::uint64_t clock_ = 0;
};

OperandCache& cache() {
  static OperandCache instance;
  return instance;
}

// Uniform in [-1, 1) with 24 random bits, from a counter-based hash (splitmix64).
float hashed_value(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + index;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * 0x1p-23f - 1.0f;
}

// Runs body(begin, end) over [0, count) in chunks, on the run's threads.
template <typename Body>
void parallel_chunks(std::int64_t count, Body&& body) {
  constexpr std::int64_t kChunk = 1 << 20;
  const std::int64_t chunks = (count + kChunk - 1) / kChunk;
  gmm::parallel_for(chunks, run_config().threads, [&](std::int64_t c, int) {
    body(c * kChunk, std::min(count, (c + 1) * kChunk));
  });
}

std::shared_ptr<void> allocate(std::size_t bytes) {
  constexpr std::size_t kAlign = 64;
  const std::size_t rounded = std::max(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) throw std::bad_alloc();
  return {p, std::free};
}

std::string cache_key(const Shape& shape, const std::string& tag, gmm::DType dtype,
                      std::int64_t groups, std::int64_t rows, std::int64_t cols) {
  return fmt::format("{}/{}/{}/{}x{}x{}", shape.name, tag, dtype, groups, rows, cols);
}

}  // namespace

Workload::Workload(const Shape& shape) : shape_(shape), group_sizes_(make_group_sizes(shape)) {
  for (const std::int32_t s : group_sizes_) {
    group_offsets_.push_back(routed_rows_);
    routed_rows_ += s;
    active_groups_ += s > 0 ? 1 : 0;
  }
}

OperandPtr Workload::dense(const std::string& tag, gmm::DType dtype, std::int64_t groups,
                           std::int64_t rows, std::int64_t cols, std::uint64_t seed, bool zero) {
  const std::int64_t count = groups * rows * cols;
  const std::size_t bytes = static_cast<std::size_t>(count) * gmm::size_of(dtype);
  return cache().get(cache_key(shape_, tag, dtype, groups, rows, cols), bytes, [&] {
    Operand op;
    op.dtype = dtype;
    op.groups = groups;
    op.rows = rows;
    op.cols = cols;
    op.bytes = bytes;
    op.owner = allocate(bytes);
    op.data = op.owner.get();
    parallel_chunks(count, [&](std::int64_t begin, std::int64_t end) {
      if (zero) {
        std::memset(static_cast<char*>(op.data) + begin * gmm::size_of(dtype), 0,
                    static_cast<std::size_t>(end - begin) * gmm::size_of(dtype));
      } else if (dtype == gmm::DType::f32) {
        for (std::int64_t i = begin; i < end; ++i) op.as<float>()[i] = hashed_value(seed, i);
      } else {
        for (std::int64_t i = begin; i < end; ++i) {
          op.as<gmm::bfloat16>()[i] = gmm::bfloat16(hashed_value(seed, i));
        }
      }
    });
    return op;
  });
}

OperandPtr Workload::activations(gmm::DType dtype) {
  return dense("x", dtype, 1, shape_.m, shape_.k, 1, false);
}

OperandPtr Workload::output_gradient(gmm::DType dtype) {
  return dense("dy", dtype, 1, shape_.m, shape_.n, 2, false);
}

OperandPtr Workload::weights(gmm::DType dtype) {
  return dense("w", dtype, shape_.groups, shape_.k, shape_.n, 3, false);
}

OperandPtr Workload::fp8_weights(gmm::BlockShape block) {
  const std::string tag = fmt::format("w-fp8-{}x{}x{}", block.groups, block.rows, block.cols);
  const std::int64_t count = shape_.groups * shape_.k * shape_.n;
  const std::int64_t scale_count =
      (shape_.groups / block.groups) * (shape_.k / block.rows) * (shape_.n / block.cols);
  const std::size_t bytes = static_cast<std::size_t>(count + 4 * scale_count);
  return cache().get(
      cache_key(shape_, tag, gmm::DType::float8_e4m3fn, shape_.groups, shape_.k, shape_.n), bytes,
      [&] {
        const OperandPtr source = weights(gmm::DType::bf16);
        auto quantized = std::make_shared<gmm::QArray>(
            gmm::quantize(source->grouped(), gmm::QType::float8_e4m3fn, block,
                          gmm::Calibration::absmax(), run_config().threads));
        Operand op;
        op.dtype = gmm::DType::float8_e4m3fn;
        op.groups = shape_.groups;
        op.rows = shape_.k;
        op.cols = shape_.n;
        op.bytes = bytes;
        op.data = quantized->qvalue.data();
        op.scales = quantized->scale.data();
        op.block = quantized->block;
        op.owner = quantized;
        return op;
      });
}

OperandPtr Workload::output(Pass pass, gmm::DType dtype) {
  switch (pass) {
    case Pass::fwd:
      return dense("y", dtype, 1, shape_.m, shape_.n, 0, true);
    case Pass::dlhs:
      return dense("dx", dtype, 1, shape_.m, shape_.k, 0, true);
    case Pass::drhs:
      break;
  }
  return dense("dw", dtype, shape_.groups, shape_.k, shape_.n, 0, true);
}

PassOperands Workload::operands(Pass pass, gmm::DType dtype) {
  PassOperands ops;
  ops.lhs = pass == Pass::dlhs ? output_gradient(dtype) : activations(dtype);
  ops.rhs = pass == Pass::drhs ? output_gradient(dtype) : weights(dtype);
  ops.out = output(pass, dtype);
  return ops;
}

OperandPtr Workload::scratch(const std::string& tag, std::int64_t groups, std::int64_t rows,
                             std::int64_t cols) {
  return dense("scratch-" + tag, gmm::DType::f32, groups, rows, cols, 0, true);
}

Workload& workload(const Shape& shape) {
  static std::unique_ptr<Workload> current;
  if (!current || current->shape().name != shape.name) {
    current.reset();
    cache().clear();
    current = std::make_unique<Workload>(shape);
  }
  return *current;
}

double case_flops(const Workload& w) {
  return 2.0 * static_cast<double>(w.routed_rows()) * static_cast<double>(w.shape().k) *
         static_cast<double>(w.shape().n);
}

gmm::DType dense_dtype(Recipe recipe) {
  return recipe == Recipe::fp32 ? gmm::DType::f32 : gmm::DType::bf16;
}

std::int64_t fp8_block_extent(std::int64_t extent) {
  std::int64_t block = 128;
  while (block > 1 && extent % block != 0) block /= 2;
  return block;
}

gmm::BlockShape weight_block(Recipe recipe, Pass pass, const Shape& shape) {
  if (recipe == Recipe::fp8_block) {
    return {1, fp8_block_extent(shape.k), fp8_block_extent(shape.n)};
  }
  return pass == Pass::dlhs ? gmm::BlockShape{1, 1, shape.n} : gmm::BlockShape{1, shape.k, 1};
}

gmm::QuantSpec activation_quantization(Recipe recipe, std::int64_t contraction) {
  gmm::QuantSpec spec;
  spec.qtype = gmm::QType::float8_e4m3fn;
  spec.block = 0;
  if (recipe == Recipe::fp8_block) spec.block = fp8_block_extent(contraction);
  if (recipe == Recipe::fp8_static) spec.calibration = gmm::Calibration::fixed(1.0f);
  return spec;
}

}  // namespace gmm_bench
