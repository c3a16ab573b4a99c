// What splitting the backward costs (zero-bubble pipelines, docs/parallel.md): one chunk's
// fused backward (Model::backward_chunk) against its B and W (backward_chunk_input, then
// backward_chunk_weights) on the same micro-batch, in one process, the ways taken in turn
// so that the machine's drift falls on all alike; W both right after B and after another
// micro-batch's forward.
//
//   pentad_split_backward_bench FAMILY LAYERS C HEADS VOCAB B T [threads=1] [iters=20]
//
// FAMILY gpt2 or llama. The chunk holds every layer, the embedding and the head (whose
// backward runs in the forward). Prints each pass's median in ms and (B + W) / fused.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "core/rng.h"
#include "model/model.h"

using namespace pentad;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr, "usage: %s gpt2|llama LAYERS C HEADS VOCAB B T [threads=1] [iters=20]\n",
                 argv[0]);
    return 2;
  }
  ModelConfig cfg;
  const std::string family = argv[1];
  cfg.family = family == "llama" ? ModelFamily::LLaMA : ModelFamily::GPT2;
  cfg.n_layer = std::atoi(argv[2]);
  cfg.d_model = std::atoi(argv[3]);
  cfg.n_head = std::atoi(argv[4]);
  cfg.vocab_size = std::atoi(argv[5]);
  const int64_t B = std::atoi(argv[6]), T = std::atoi(argv[7]);
  cfg.max_seq_len = T;
  omp_set_num_threads(argc > 8 ? std::atoi(argv[8]) : 1);
  const int iters = argc > 9 ? std::atoi(argv[9]) : 20;

  Model model(cfg, B, T);
  model.params().initialize(1);
  std::vector<int32_t> tokens(size_t(B * T)), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = int32_t(splitmix64(i) % uint64_t(cfg.vocab_size));
    targets[i] = int32_t(splitmix64(i + tokens.size()) % uint64_t(cfg.vocab_size));
  }
  const float dloss = 1.0f / float(B * T);
  const Tensor none;
  // Three ways in turn: fused; B then W at once; and B, another micro-batch's forward (slot
  // 1), then W, as a zero-bubble stage runs them (W's operands no longer in the caches).
  model.add_slot(0);
  std::vector<double> fwd, fused, b, w, w_apart;
  for (int i = 0; i < iters + 2; ++i) {  // two warm-ups
    const bool timed = i >= 2;
    for (int k = 0; k < 3; ++k) {
      const int way = (k + i) % 3;
      const double t0 = now();
      model.forward_chunk(0, 0, tokens.data(), targets.data(), dloss);
      const double t1 = now();
      if (timed) fwd.push_back(t1 - t0);
      if (way == 0) {
        model.backward_chunk(0, 0, none, false, {});
        if (timed) fused.push_back(now() - t1);
        continue;
      }
      model.backward_chunk_input(0, 0, none);
      const double t2 = now();
      if (way == 1) {
        model.backward_chunk_weights(0, 0, false, {});
        if (timed) b.push_back(t2 - t1), w.push_back(now() - t2);
        continue;
      }
      model.forward_chunk(0, 1, tokens.data(), targets.data(), dloss);
      const double t3 = now();
      model.backward_chunk_weights(0, 0, false, {});
      if (timed) w_apart.push_back(now() - t3);
      model.backward_chunk_input(0, 1, none);
      model.backward_chunk_weights(0, 1, false, {});
    }
  }
  const double mb = median(b) * 1e3, mw = median(w) * 1e3, mf = median(fused) * 1e3,
               ma = median(w_apart) * 1e3;
  std::printf(
      "pentad split backward %s layers=%ld C=%ld heads=%ld vocab=%ld B=%ld T=%ld threads=%d\n",
      family.c_str(), long(cfg.n_layer), long(cfg.d_model), long(cfg.n_head), long(cfg.vocab_size),
      long(B), long(T), omp_get_max_threads());
  std::printf(
      "forward %.2f ms  fused backward %.2f ms  B %.2f ms  W %.2f ms (after a forward: %.2f)  "
      "(B + W) / fused %.3f (%.3f)\n",
      median(fwd) * 1e3, mf, mb, mw, ma, (mb + mw) / mf, (mb + ma) / mf);
  return 0;
}
