// Demo: a small MoE expert block (up projection, ReLU, down projection) trained on synthetic data
// with gmm::forward / gmm::backward under a plan and a recipe, printing the loss and what each
// pass ran.
//
//   gmm_demo [PLAN [RECIPE [STEPS]]]     defaults: hybrid fp8_full 40
//   PLAN:   v1 | v2 | hybrid | auto | three of v1/v2/auto for fwd,dlhs,drhs (e.g. v2,v1,v2)
//   RECIPE: none | fp8_full | fp8_blockwise | fp8_static(MAX)
//
// A fixed teacher block (same shape, unquantized) labels random tokens; a top-1 router sends each
// token to one of the experts; the student block learns the teacher with plain SGD.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <gmm/gmm.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using Mat = gmm::RowMajorMatrix<float>;

constexpr int kExperts = 8, kTokens = 1024, kModel = 128, kHidden = 256;

// One expert block: up [E * D, H] (E stacked [D, H] experts) and down [E * H, D].
struct Block {
  Mat up, down;
};

Mat random_normal(std::mt19937& rng, int rows, int cols, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  Mat m(rows, cols);
  for (int i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
  return m;
}

Block random_block(std::mt19937& rng) {
  return {random_normal(rng, kExperts * kModel, kHidden, 1.0f / std::sqrt(float(kModel))),
          random_normal(rng, kExperts * kHidden, kModel, 1.0f / std::sqrt(float(kHidden)))};
}

// Tokens sorted by the expert the router picks (top-1), with each expert's token count.
struct Batch {
  Mat x;
  std::vector<std::int32_t> sizes;
};

Batch make_batch(std::mt19937& rng, const Mat& router) {
  const Mat tokens = random_normal(rng, kTokens, kModel, 1.0f);
  const Mat logits = tokens * router;
  std::vector<int> expert(kTokens);
  Batch b{Mat(kTokens, kModel), std::vector<std::int32_t>(kExperts, 0)};
  for (int t = 0; t < kTokens; ++t) {
    logits.row(t).maxCoeff(&expert[t]);
    ++b.sizes[expert[t]];
  }
  std::vector<int> order(kTokens);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return expert[a] < expert[c]; });
  for (int t = 0; t < kTokens; ++t) b.x.row(t) = tokens.row(order[t]);
  return b;
}

// The activations forward saves for backward, and each layer's trace.
struct Forward {
  Mat h_pre, h, out;
  gmm::Saved up, down;
  gmm::Trace up_trace, down_trace;
};

// Fills f (whose matrices the saved views point into, so it must stay put until backward).
void run_forward(const Block& block, const Batch& b, const gmm::Plan& plan,
                 const gmm::Recipe& recipe, Forward& f) {
  f.h_pre.resize(kTokens, kHidden);
  f.out.resize(kTokens, kModel);
  gmm::PassOptions options;
  options.trace = &f.up_trace;
  f.up = gmm::forward({gmm::view(b.x), gmm::grouped_view(block.up, kExperts), b.sizes},
                      gmm::out_view(f.h_pre), plan, recipe, options);
  f.h = f.h_pre.cwiseMax(0.0f);
  options.trace = &f.down_trace;
  f.down = gmm::forward({gmm::view(f.h), gmm::grouped_view(block.down, kExperts), b.sizes},
                        gmm::out_view(f.out), plan, recipe, options);
}

// One SGD step on loss = sum of squared errors / (2 * tokens); returns the loss.
float train_step(Block& student, const Block& teacher, const Batch& b, const gmm::Plan& plan,
                 const gmm::Recipe& recipe, float lr, Forward& f) {
  Forward target;
  run_forward(teacher, b, gmm::Plan::v2(), gmm::Recipe::none(), target);
  run_forward(student, b, plan, recipe, f);
  const Mat diff = f.out - target.out;
  const float loss = 0.5f * diff.squaredNorm() / kTokens;
  const Mat dout = diff / float(kTokens);

  Mat dh(kTokens, kHidden), d_down(kExperts * kHidden, kModel), d_up(kExperts * kModel, kHidden);
  gmm::PassOptions options;
  options.trace = &f.down_trace;
  gmm::backward(f.down, gmm::view(dout),
                {gmm::out_view(dh), gmm::out_grouped_view(d_down, kExperts)}, plan, options);
  const Mat dh_pre = (f.h_pre.array() > 0.0f).select(dh, 0.0f);
  options.trace = &f.up_trace;  // the first layer needs no dx: dlhs is skipped
  gmm::backward(f.up, gmm::view(dh_pre), {gmm::OutMatrix{}, gmm::out_grouped_view(d_up, kExperts)},
                plan, options);
  student.down -= lr * d_down;
  student.up -= lr * d_up;
  return loss;
}

void print_trace(const char* layer, const gmm::Trace& trace) {
  for (gmm::Pass pass : gmm::all_passes) {
    if (trace.ran(pass)) {
      std::printf("  %-4s %s\n", layer, fmt::format("{}", trace.at(pass)).c_str());
    } else {
      std::printf("  %-4s %s: not run (no dx needed)\n", layer, std::string(name(pass)).c_str());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const gmm::Plan plan = gmm::Plan::parse(argc > 1 ? argv[1] : "hybrid");
    const gmm::Recipe recipe = gmm::Recipe::parse(argc > 2 ? argv[2] : "fp8_full");
    const int steps = argc > 3 ? std::atoi(argv[3]) : 40;
    std::printf("gmm demo: MoE block x[%d, %d] -> %d experts [%d -> %d -> %d], top-1 routing\n",
                kTokens, kModel, kExperts, kModel, kHidden, kModel);
    std::printf("plan %s (fwd %s, dlhs %s, drhs %s)\nrecipe %s: %s\n\n", plan.to_string().c_str(),
                plan.fwd ? std::string(name(*plan.fwd)).c_str() : "auto",
                plan.dlhs ? std::string(name(*plan.dlhs)).c_str() : "auto",
                plan.drhs ? std::string(name(*plan.drhs)).c_str() : "auto",
                recipe.to_string().c_str(), recipe.describe().c_str());

    std::mt19937 rng(2026);
    const Mat router = random_normal(rng, kModel, kExperts, 1.0f);
    const Block teacher = random_block(rng);
    Block student = random_block(rng);
    const float lr = 0.3f;
    float first = 0.0f, last = 0.0f;
    double seconds = 0.0;
    for (int step = 1; step <= steps; ++step) {
      const Batch batch = make_batch(rng, router);
      Forward f;
      const auto start = std::chrono::steady_clock::now();
      last = train_step(student, teacher, batch, plan, recipe, lr, f);
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (step == 1) {
        first = last;
        std::printf("what each pass ran (step 1; experts' tokens:");
        for (std::int32_t s : batch.sizes) std::printf(" %d", s);
        std::printf("):\n");
        print_trace("up", f.up_trace);
        print_trace("down", f.down_trace);
        std::printf("\n");
      }
      if (step <= 5 || step % 5 == 0 || step == steps)
        std::printf("step %3d  loss %.4f\n", step, last);
    }
    std::printf("\nloss %.4f -> %.4f over %d steps, %.1f ms per step (teacher included)\n", first,
                last, steps, 1e3 * seconds / std::max(steps, 1));
  } catch (const gmm::Error& e) {
    std::fprintf(stderr, "gmm_demo: %s\n", e.what());
    return 2;
  }
  return 0;
}
