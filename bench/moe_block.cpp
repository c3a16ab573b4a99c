// The MoE block on the CPU, two measurements (bench/moe_bench.sh runs them against PyTorch):
//
//   pentad_moe_block_bench block C E K F TOKENS [threads=2] [iters=10] [skew=0]
//     One LLaMA-family MoeBlock (router, top-K of E SwiGLU experts of width F, model width
//     C) on TOKENS random rows: forward + backward, median over `iters` after 2 warm-ups.
//     skew=1 sets expert 0's selection bias so that every token picks it (half the picks
//     with K = 2). Prints "tokens_per_second <v>" and the forward's share.
//
//   pentad_moe_block_bench gemm C E K F TOKENS [threads=2] [iters=10]
//     The experts' forward GEMMs alone (gate, up, down, as the block runs them: grouped
//     GEMMs, kernels::grouped_linear_forward) with balanced rows (TOKENS*K/E each) and
//     skewed rows (half to expert 0, the rest spread evenly), against the same FLOPs as
//     one dense problem (kernels::linear_forward on all TOKENS*K rows with one expert's
//     weights) and against one multi-threaded linear_forward per expert (the block before
//     the grouped GEMMs). Checks first that grouped and per-expert give the same bits.
//
// Inputs are random (never zeros); weights come from ParamStore::initialize.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "model/moe.h"

using namespace pentad;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median seconds of f over `iters` runs after `warmup` untimed ones.
double median_seconds(int warmup, int iters, const std::function<void()>& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> s;
  for (int i = 0; i < iters; ++i) {
    const double t0 = now();
    f();
    s.push_back(now() - t0);
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

void fill_random(std::vector<float>& v, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : v) x = normal(rng);
}

ModelConfig moe_config(int64_t C, int64_t E, int64_t K, int64_t F) {
  ModelConfig cfg;
  cfg.family = ModelFamily::LLaMA;
  cfg.n_layer = 1;
  cfg.d_model = C;
  cfg.n_head = 1;
  cfg.moe_layers = "all";
  cfg.n_experts = E;
  cfg.top_k = K;
  cfg.d_ff_expert = F;
  return cfg;  // [moe] defaults: softmax, renormalised, dropless, no balancing losses
}

int block(int64_t C, int64_t E, int64_t K, int64_t F, int64_t N, int iters, bool skew) {
  const ModelConfig cfg = moe_config(C, E, K, F);
  ParamStore params;
  ExpertParallelHooks ep;
  TensorParallelHooks tp;
  ContextParallelHooks cp;
  MoeScratch scratch;
  MoeBlock moe(cfg, 0, params, ep, tp, cp, /*micro_batch=*/1, /*seq_len=*/N, Device::CPU,
               DType::F32, scratch);
  params.allocate();
  params.initialize(1234);
  if (skew) params.param(moe.bias()).f32()[0] = 1.0f;  // above any softmax gap: always picked

  std::vector<float> x(size_t(N * C)), dout(x.size()), out(x.size()), dx(x.size());
  fill_random(x, 1);
  fill_random(dout, 2);
  const Tensor xt = view_of(x.data(), Shape{N, C}), dt = view_of(dout.data(), Shape{N, C});
  MoeBlock::Acts acts;
  auto forward = [&] { moe.forward(acts, xt, view_of(out.data(), Shape{N, C}), 1.0f); };
  auto step = [&] {
    forward();
    moe.backward(acts, xt, dt, view_of(dx.data(), Shape{N, C}), 1.0f);
  };
  const double fwd = median_seconds(2, iters, forward);
  const double both = median_seconds(2, iters, step);
  const int64_t most = *std::max_element(acts.route.rows.begin(), acts.route.rows.end());
  // Expert FLOPs: 3 GEMMs of 2 N K C F forward, twice that backward; the router's are small.
  const double flops = 3.0 * 3.0 * 2.0 * double(N * K) * double(C * F);
  std::printf("pentad moe block C=%ld E=%ld K=%ld F=%ld tokens=%ld threads=%d skew=%d\n", long(C),
              long(E), long(K), long(F), long(N), omp_get_max_threads(), int(skew));
  std::printf("busiest expert rows %ld of %ld picks (balanced: %ld)\n", long(most), long(N * K),
              long(N * K / E));
  std::printf("forward %.3f ms, forward+backward %.3f ms (forward %.0f%%), expert GFLOP/s %.1f\n",
              fwd * 1e3, both * 1e3, 100.0 * fwd / both, flops / both / 1e9);
  std::printf("tokens_per_second %.1f\n", double(N) / both);
  return 0;
}

// The experts' forward GEMMs on rows[e] rows each: grouped (as MoeBlock::experts_forward
// runs them) or one multi-threaded linear_forward per expert (as it ran them before).
struct ExpertGemms {
  int64_t C, F;
  std::vector<std::vector<float>> gate, up, down;  // per expert: (F, C), (F, C), (C, F)
  std::vector<float> x, g, u, a, y;                // (R, C), (R, F) x3, (R, C)

  ExpertGemms(int64_t C_, int64_t E, int64_t F_, int64_t R) : C(C_), F(F_) {
    uint64_t seed = 100;
    for (int64_t e = 0; e < E; ++e)
      for (auto* w : {&gate, &up, &down}) {
        w->emplace_back(size_t(C * F));
        fill_random(w->back(), seed++);
        for (float& v : w->back()) v *= 0.02f;
      }
    x.resize(size_t(R * C));
    fill_random(x, 3);
    g.resize(size_t(R * F));
    u.resize(g.size());
    a.resize(g.size());
    y.resize(x.size());
  }
  std::vector<Tensor> weights(std::vector<std::vector<float>>& w, Shape shape, size_t n) {
    std::vector<Tensor> out;
    for (size_t e = 0; e < n; ++e) out.push_back(view_of(w[e].data(), shape));
    return out;
  }
  void grouped(const std::vector<int64_t>& rows) {
    const int64_t R = int64_t(x.size()) / C;
    const Tensor xt = view_of(x.data(), Shape{R, C}), gt = view_of(g.data(), Shape{R, F}),
                 ut = view_of(u.data(), Shape{R, F}), at = view_of(a.data(), Shape{R, F});
    kernels::grouped_linear_forward(gt, xt, rows, weights(gate, Shape{F, C}, rows.size()), {});
    kernels::grouped_linear_forward(ut, xt, rows, weights(up, Shape{F, C}, rows.size()), {});
    kernels::swiglu_forward(at, gt, ut);
    kernels::grouped_linear_forward(view_of(y.data(), Shape{R, C}), at, rows,
                                    weights(down, Shape{C, F}, rows.size()), {});
  }
  void per_expert(const std::vector<int64_t>& rows) {
    int64_t row = 0;
    for (size_t e = 0; e < rows.size(); ++e) {
      const int64_t n = rows[e];
      if (n == 0) continue;
      const Tensor xr = view_of(x.data() + row * C, Shape{n, C});
      const Tensor g_t = view_of(g.data() + row * F, Shape{n, F});
      const Tensor u_t = view_of(u.data() + row * F, Shape{n, F});
      const Tensor a_t = view_of(a.data() + row * F, Shape{n, F});
      kernels::linear_forward(g_t, xr, view_of(gate[e].data(), Shape{F, C}), Tensor{});
      kernels::linear_forward(u_t, xr, view_of(up[e].data(), Shape{F, C}), Tensor{});
      kernels::swiglu_forward(a_t, g_t, u_t);
      kernels::linear_forward(view_of(y.data() + row * C, Shape{n, C}), a_t,
                              view_of(down[e].data(), Shape{C, F}), Tensor{});
      row += n;
    }
  }
};

// Whether the grouped kernels give the per-expert linear layers' bits: forward outputs, and
// backward's d(input) and weight gradients (one layer); relative_gap: how far apart if not.
bool grouped_matches_per_expert(ExpertGemms& ex, const std::vector<int64_t>& rows,
                                double& relative_gap) {
  ex.per_expert(rows);
  const std::vector<float> y = ex.y;
  ex.grouped(rows);
  bool same = y == ex.y;
  const int64_t C = ex.C, F = ex.F, R = int64_t(ex.x.size()) / C, E = int64_t(rows.size());
  std::vector<float> dx1(size_t(R * C)), dx2(dx1.size());
  std::vector<std::vector<float>> dw1(size_t(E), std::vector<float>(size_t(F * C), 0.5f)),
      dw2 = dw1;
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = rows[size_t(e)];
    kernels::linear_backward(view_of(dx1.data() + row * C, Shape{n, C}),
                             view_of(dw1[size_t(e)].data(), Shape{F, C}), Tensor{},
                             view_of(ex.g.data() + row * F, Shape{n, F}),
                             view_of(ex.x.data() + row * C, Shape{n, C}),
                             view_of(ex.gate[size_t(e)].data(), Shape{F, C}), false);
    row += n;
  }
  kernels::grouped_linear_backward(
      view_of(dx2.data(), Shape{R, C}), ex.weights(dw2, Shape{F, C}, size_t(E)), {},
      view_of(ex.g.data(), Shape{R, F}), view_of(ex.x.data(), Shape{R, C}), rows,
      ex.weights(ex.gate, Shape{F, C}, size_t(E)), false);
  // Largest difference relative to the largest value, over the three results.
  auto gap = [](const std::vector<float>& p, const std::vector<float>& q) {
    double diff = 0, most = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      diff = std::max(diff, double(std::abs(p[i] - q[i])));
      most = std::max(most, double(std::abs(p[i])));
    }
    return diff / std::max(most, 1e-30);
  };
  double worst = std::max(gap(y, ex.y), gap(dx1, dx2));
  for (int64_t e = 0; e < E; ++e) worst = std::max(worst, gap(dw1[size_t(e)], dw2[size_t(e)]));
  relative_gap = worst;
  return same && dx1 == dx2 && dw1 == dw2;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int gemm(int64_t C, int64_t E, int64_t K, int64_t F, int64_t N, int iters) {
  const int64_t R = N * K;
  ExpertGemms experts(C, E, F, R);
  std::vector<int64_t> balanced(size_t(E), R / E);
  balanced[0] += R - R / E * E;
  std::vector<int64_t> skewed(size_t(E), (R - R / 2) / (E - 1));
  skewed[0] = R - (R - R / 2) / (E - 1) * (E - 1);
  const std::vector<int64_t> dense = {R};  // every row through expert 0: one GEMM each
  const double flops = 3.0 * 2.0 * double(R) * double(C * F);
  std::printf("pentad expert GEMMs (forward) C=%ld E=%ld K=%ld F=%ld rows=%ld threads=%d\n",
              long(C), long(E), long(K), long(F), long(R), omp_get_max_threads());
  for (const auto& [name, rows] : {std::pair{"balanced", balanced}, std::pair{"skewed", skewed}}) {
    double gap = 0;
    const bool same = grouped_matches_per_expert(experts, rows, gap);
    std::printf(
        "grouped kernels against per-expert linear layers, %s rows: %s (largest gap %.2g "
        "of the largest value)\n",
        name, same ? "bitwise equal" : "differ", gap);
  }
  // Alternate the runs so that the machine's noise falls on all of them alike.
  const std::vector<std::pair<const char*, std::function<void()>>> runs = {
      {"dense", [&] { experts.per_expert(dense); }},
      {"grouped balanced", [&] { experts.grouped(balanced); }},
      {"grouped skewed", [&] { experts.grouped(skewed); }},
      {"per-expert balanced", [&] { experts.per_expert(balanced); }},
      {"per-expert skewed", [&] { experts.per_expert(skewed); }},
  };
  std::vector<std::vector<double>> seconds(runs.size());
  for (const auto& r : runs) r.second();  // warm-up
  for (int i = 0; i < iters; ++i)
    for (size_t r = 0; r < runs.size(); ++r)
      seconds[r].push_back(median_seconds(0, 1, runs[r].second));
  const double dense_s = median(seconds[0]);
  std::printf("rows: balanced %ld x %ld, skewed %ld + %ld x %ld\n", long(E), long(balanced[1]),
              long(skewed[0]), long(E - 1), long(skewed[1]));
  for (size_t r = 0; r < runs.size(); ++r) {
    const double t = median(seconds[r]);
    std::printf("%-20s %9.3f ms %7.1f GFLOP/s %6.3f of dense\n", runs[r].first, t * 1e3,
                flops / t / 1e9, dense_s / t);
  }
  std::printf("grouped_over_dense balanced %.3f skewed %.3f\n", dense_s / median(seconds[1]),
              dense_s / median(seconds[2]));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: %s block|gemm C E K F TOKENS [threads=2] [iters=10] [skew=0]\n",
                 argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const int64_t C = std::atol(argv[2]), E = std::atol(argv[3]), K = std::atol(argv[4]),
                F = std::atol(argv[5]), N = std::atol(argv[6]);
  omp_set_num_threads(argc > 7 ? std::atoi(argv[7]) : 2);
  const int iters = argc > 8 ? std::atoi(argv[8]) : 10;
  const bool skew = argc > 9 && std::atoi(argv[9]) != 0;
  if (mode == "block") return block(C, E, K, F, N, iters, skew);
  if (mode == "gemm") return gemm(C, E, K, F, N, iters);
  std::fprintf(stderr, "unknown mode '%s': block or gemm\n", mode.c_str());
  return 2;
}
