// The host AdamW's update rate (bench/adamw_bench.sh runs it against torch.optim.AdamW):
//
//   pentad_adamw_bench [elements=100000000] [reps=20] [layouts=flat,gpt2]
//
// Times AdamW::step (optim/adamw.h: the update in place, as training runs it) on two
// parameter tables, each with random parameters and gradients:
//   flat  one parameter of `elements` F32 elements (with weight decay);
//   gpt2  GPT-2 124M's table (wte, wpe, 12 layers, ln_f; decay on matrices only), 124.4M
//         elements in 148 parameters, in HF GPT-2 order.
// The update reads p, m, v, g and writes p, m, v: 28 bytes of memory traffic per element,
// and at about a dozen FLOPs per 28 bytes it is bound by memory bandwidth, so the program
// also measures the bandwidth it can reach on the same threads and the same elements:
//   triad     a = b + s*c (STREAM's convention: 12 bytes per element counted);
//   same-rw   p += g, m += g, v += g on the AdamW buffers: the update's exact pattern of
//             reads and writes with trivial arithmetic, 28 bytes per element; the ceiling.
// Each figure is the median over `reps` after 2 warm-ups, with the OpenMP thread count
// (OMP_NUM_THREADS; the script sets 2). Lines starting "RESULT" are for the script.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/params.h"
#include "optim/adamw.h"

using namespace pentad;

namespace {

constexpr double kAdamWBytesPerElement = 28.0;  // read p, m, v, g; write p, m, v (F32)

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median_seconds(int warmup, int reps, const std::function<void()>& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> s;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now();
    f();
    s.push_back(now() - t0);
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

// Uniform in [-1, 1) from a hash of (seed, i): parallel, and the same for any thread count.
void fill_random(float* x, int64_t n, uint64_t seed) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x[i] = static_cast<float>(z >> 40) / static_cast<float>(1 << 23) - 1.0f;
  }
}

// GPT-2 124M in HF's names and order: 50257 x 768 tied embedding, 1024
// positions, 12 layers of 768 wide attention and 3072 wide MLP.
void add_gpt2_124m(ParamStore& params) {
  const int64_t V = 50257, T = 1024, C = 768, L = 12;
  auto add = [&](const std::string& name, Shape shape) {
    params.add(name, shape, Init::Normal, 0.02f, /*weight_decay=*/shape.ndim >= 2);
  };
  add("wte.weight", Shape{V, C});
  add("wpe.weight", Shape{T, C});
  for (int64_t l = 0; l < L; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", Shape{C});
    add(h + "ln_1.bias", Shape{C});
    add(h + "attn.c_attn.weight", Shape{3 * C, C});
    add(h + "attn.c_attn.bias", Shape{3 * C});
    add(h + "attn.c_proj.weight", Shape{C, C});
    add(h + "attn.c_proj.bias", Shape{C});
    add(h + "ln_2.weight", Shape{C});
    add(h + "ln_2.bias", Shape{C});
    add(h + "mlp.c_fc.weight", Shape{4 * C, C});
    add(h + "mlp.c_fc.bias", Shape{4 * C});
    add(h + "mlp.c_proj.weight", Shape{C, 4 * C});
    add(h + "mlp.c_proj.bias", Shape{C});
  }
  add("ln_f.weight", Shape{C});
  add("ln_f.bias", Shape{C});
}

// Memory bandwidth on the same threads: a STREAM triad over three arrays of n floats.
double triad_bytes_per_second(int64_t n, int reps) {
  std::vector<float> a(static_cast<size_t>(n)), b(a.size()), c(a.size());
  fill_random(b.data(), n, 11);
  fill_random(c.data(), n, 12);
  float* pa = a.data();
  const float *pb = b.data(), *pc = c.data();
  const float s = 1.0001f;
  const double t = median_seconds(2, reps, [&] {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) pa[i] = pb[i] + s * pc[i];
  });
  return 12.0 * static_cast<double>(n) / t;
}

void run_layout(const std::string& layout, int64_t elements, int reps, double triad) {
  ParamStore params;
  if (layout == "gpt2")
    add_gpt2_124m(params);
  else
    params.add("flat", Shape{elements}, Init::Normal, 0.02f, /*weight_decay=*/true);
  params.allocate();
  // The arena pads large parameters to 4 KiB pages: the update and its rate count the
  // parameters' own elements, the bandwidth loop below the whole arena.
  const int64_t arena = params.numel();
  int64_t n = 0;
  for (const ParamSpec& spec : params.specs()) n += spec.local_shape.numel();
  fill_random(params.all_params().f32(), arena, 1);
  fill_random(params.all_grads().f32(), arena, 2);
  OptimConfig cfg;  // lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1
  AdamW adamw(cfg, params);

  const double step_s = median_seconds(2, reps, [&] { adamw.step(params, cfg.lr); });
  // The update's pattern of reads and writes (4 in, 3 out, in place, one pass) with a
  // trivial body: what the memory allows for this access pattern.
  float* p = params.all_params().f32();
  float* m = static_cast<float*>(adamw.m_base());
  float* v = static_cast<float*>(adamw.v_base());
  const float* g = params.all_grads().f32();
  const double same_rw_s = median_seconds(2, reps, [&] {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < arena; ++i) {
      p[i] += g[i];
      m[i] += g[i];
      v[i] += g[i];
    }
  });

  const double bytes = kAdamWBytesPerElement * static_cast<double>(n);
  const double rate = static_cast<double>(n) / step_s;
  const double same_rw = kAdamWBytesPerElement * static_cast<double>(arena) / same_rw_s;
  std::printf(
      "%-5s %11ld elements in %3zu parameters: step %8.2f ms, %6.3f G params/s, %6.2f GB/s "
      "(same-rw %6.2f GB/s: %3.0f%%; triad %6.2f GB/s: %3.0f%%)\n",
      layout.c_str(), static_cast<long>(n), params.specs().size(), 1e3 * step_s, rate / 1e9,
      bytes / step_s / 1e9, same_rw / 1e9, 100.0 * bytes / step_s / same_rw, triad / 1e9,
      100.0 * bytes / step_s / triad);
  std::printf("RESULT %s params_per_second %.6g\n", layout.c_str(), rate);
  std::printf("RESULT %s same_rw_bytes_per_second %.6g\n", layout.c_str(), same_rw);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t elements = argc > 1 ? std::stoll(argv[1]) : 100'000'000;
  const int reps = argc > 2 ? std::stoi(argv[2]) : 20;
  const std::string layouts = argc > 3 ? argv[3] : "flat,gpt2";
  std::printf("pentad host AdamW, %d OpenMP threads, median of %d after 2 warm-ups\n",
              omp_get_max_threads(), reps);
  const double triad = triad_bytes_per_second(elements, reps);
  std::printf("triad over 3 x %ld floats: %.2f GB/s (12 bytes per element)\n",
              static_cast<long>(elements), triad / 1e9);
  std::printf("RESULT triad bytes_per_second %.6g\n", triad);
  std::stringstream list(layouts);
  for (std::string layout; std::getline(list, layout, ',');) {
    if (layout != "flat" && layout != "gpt2") {
      std::fprintf(stderr, "unknown layout '%s' (flat, gpt2)\n", layout.c_str());
      return 2;
    }
    run_layout(layout, elements, reps, triad);
  }
  return 0;
}
