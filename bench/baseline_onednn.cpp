// Baseline: a per-group loop of oneDNN matmul primitives (fp32 and bf16), created before timing.
#include <cstring>
#include <dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "harness.hpp"

namespace gmm_bench {
namespace {

using dnnl::memory;

// One group's product: its primitive and the memory objects bound to its slices.
struct GroupCall {
  dnnl::matmul primitive;
  std::unordered_map<int, memory> args;
};

memory::desc strided(memory::data_type type, memory::dim rows, memory::dim cols,
                     memory::dim row_stride, memory::dim col_stride) {
  return memory::desc({rows, cols}, type, {row_stride, col_stride});
}

// Primitives and arguments of every non-empty group: fwd out_g = x_g w_g; dlhs out_g =
// dy_g w_g^T; drhs out_g = x_g^T dy_g. Returns the implementation oneDNN picked in `impl`.
std::vector<GroupCall> make_calls(Pass pass, const Workload& w, memory::data_type type,
                                  const dnnl::engine& engine, const Operand& lhs,
                                  const Operand& rhs, const Operand& out, std::string* impl) {
  const memory::dim k = w.shape().k, n = w.shape().n;
  const std::size_t element = gmm::size_of(out.dtype);
  char* lhs_data = static_cast<char*>(lhs.data);
  char* rhs_data = static_cast<char*>(rhs.data);
  char* out_data = static_cast<char*>(out.data);
  std::vector<GroupCall> calls;
  for (std::int64_t g = 0; g < w.shape().groups; ++g) {
    const memory::dim rows = w.group_sizes()[g], first = w.group_offsets()[g];
    if (rows == 0) continue;
    memory::desc src, weights, dst;
    void *src_ptr, *weights_ptr, *dst_ptr;
    if (pass == Pass::fwd) {
      src = strided(type, rows, k, k, 1);
      weights = strided(type, k, n, n, 1);
      dst = strided(type, rows, n, n, 1);
      src_ptr = lhs_data + first * k * element;
      weights_ptr = rhs_data + g * k * n * element;
      dst_ptr = out_data + first * n * element;
    } else if (pass == Pass::dlhs) {
      src = strided(type, rows, n, n, 1);
      weights = strided(type, n, k, 1, n);
      dst = strided(type, rows, k, k, 1);
      src_ptr = lhs_data + first * n * element;
      weights_ptr = rhs_data + g * k * n * element;
      dst_ptr = out_data + first * k * element;
    } else {
      src = strided(type, k, rows, 1, k);
      weights = strided(type, rows, n, n, 1);
      dst = strided(type, k, n, n, 1);
      src_ptr = lhs_data + first * k * element;
      weights_ptr = rhs_data + first * n * element;
      dst_ptr = out_data + g * k * n * element;
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, weights, dst), engine);
    if (impl->empty()) *impl = pd.impl_info_str();
    calls.push_back({dnnl::matmul(pd),
                     {{DNNL_ARG_SRC, memory(src, engine, src_ptr)},
                      {DNNL_ARG_WEIGHTS, memory(weights, engine, weights_ptr)},
                      {DNNL_ARG_DST, memory(dst, engine, dst_ptr)}}});
  }
  return calls;
}

void run_onednn(benchmark::State& state, const Case& c) {
  Workload& w = workload(*c.shape);
  const gmm::DType dtype = dense_dtype(c.recipe);
  const memory::data_type type =
      c.recipe == Recipe::fp32 ? memory::data_type::f32 : memory::data_type::bf16;
  const bool drhs = c.pass == Pass::drhs;
  try {
    const PassOperands ops = w.operands(c.pass, dtype);
    const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    std::string impl;
    const std::vector<GroupCall> calls =
        make_calls(c.pass, w, type, engine, *ops.lhs, *ops.rhs, *ops.out, &impl);
    const std::size_t block_bytes =
        static_cast<std::size_t>(c.shape->k * c.shape->n) * gmm::size_of(dtype);
    const LoopTime time = time_calls(state, w, [&] {
      for (std::int64_t g = 0; drhs && g < c.shape->groups; ++g) {
        if (w.group_sizes()[g] == 0) {
          std::memset(static_cast<char*>(ops.out->data) + g * block_bytes, 0, block_bytes);
        }
      }
      for (const GroupCall& call : calls) call.primitive.execute(stream, call.args);
      stream.wait();
    });
    set_counters(state, c, w, time, weight_bytes(c, w, ops.weight_like(c.pass)), 0,
                 run_config().threads);
    state.SetLabel(impl);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

std::string isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    default:
      return "other";
  }
}

}  // namespace

void register_onednn_baselines(const Case& c) {
  if (c.recipe != Recipe::fp32 && c.recipe != Recipe::bf16) return;
  configure(benchmark::RegisterBenchmark(benchmark_name(c, "baseline-onednn").c_str(),
                                         [c](benchmark::State& state) { run_onednn(state, c); }));
}

std::string onednn_description() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + ", ISA " + isa_name(dnnl::get_effective_cpu_isa());
}

}  // namespace gmm_bench
