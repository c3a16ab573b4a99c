// Which layers are MoE layers, how wide their experts are, and the expert-parallel hooks of
// one device (model/moe.h, model/sharding.h).
#include <numeric>
#include <string>

#include "core/device_memory.h"
#include "model/moe.h"

namespace pentad {

bool is_moe_layer(const ModelConfig& cfg, int64_t layer) {
  const std::string& p = cfg.moe_layers;
  if (cfg.n_experts <= 0 || p.empty()) return false;
  auto number = [&](const std::string& text) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != text.size() || v < 0)
      fail(
          "model.moe_layers = \"{}\": \"{}\" is not a layer number; write \"all\", \"every:N\", "
          "\"from:K\" or a list such as \"1,3\"",
          p, text);
    return static_cast<int64_t>(v);
  };
  if (p == "all") return true;
  if (p.starts_with("every:")) {
    const int64_t n = number(p.substr(6));
    if (n < 1) fail("model.moe_layers = \"{}\": every:N needs N >= 1", p);
    return (layer + 1) % n == 0;
  }
  if (p.starts_with("from:")) return layer >= number(p.substr(5));
  bool found = false;
  size_t start = 0;
  while (start <= p.size()) {
    const size_t comma = std::min(p.find(',', start), p.size());
    const int64_t l = number(p.substr(start, comma - start));
    if (l >= cfg.n_layer)
      fail("model.moe_layers = \"{}\" names layer {}, but model.n_layer = {}", p, l, cfg.n_layer);
    found = found || l == layer;
    start = comma + 1;
  }
  return found;
}

std::vector<int64_t> moe_layer_indices(const ModelConfig& cfg) {
  std::vector<int64_t> out;
  for (int64_t l = 0; l < cfg.n_layer; ++l)
    if (is_moe_layer(cfg, l)) out.push_back(l);
  return out;
}

int64_t expert_ffn_dim(const ModelConfig& cfg) {
  if (cfg.d_ff_expert > 0) return cfg.d_ff_expert;
  if (cfg.d_ff > 0) return cfg.d_ff;
  if (cfg.family == ModelFamily::GPT2) return 4 * cfg.d_model;
  const int64_t hidden = 2 * (4 * cfg.d_model) / 3;
  return (hidden + 255) / 256 * 256;
}

// ---- one device's expert parallelism: every expert here ----

void ExpertParallelHooks::plan(ExpertRoute& route) {
  route.rows = route.send;
  route.recv_rows = std::accumulate(route.send.begin(), route.send.end(), int64_t{0});
}
void ExpertParallelHooks::dispatch(const ExpertRoute&, const Tensor& in, Tensor out) {
  if (in.numel() > 0) copy(out, in);
}
void ExpertParallelHooks::combine(const ExpertRoute&, const Tensor& in, Tensor out) {
  if (in.numel() > 0) copy(out, in);
}

}  // namespace pentad
