// Which layers are MoE layers (model.moe_layers) and the experts' width: the parts of
// model/moe.h that the recipe checks and the memory plan need without building a model.
#include <charconv>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "model/model.h"
#include "model/moe.h"

namespace pentad {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

// A whole non-negative decimal number, or -1.
int64_t parse_count(std::string_view s) {
  s = trim(s);
  int64_t value = -1;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || value < 0) return -1;
  return value;
}

// One flag per layer: is it an MoE layer. Throws naming the key for a pattern that does not
// parse or names a layer the model does not have.
std::vector<bool> moe_flags(const ModelConfig& cfg) {
  const std::string& pattern = cfg.moe_layers;
  const int64_t n = cfg.n_layer;
  std::vector<bool> flags(size_t(n), false);
  const std::string_view p = trim(pattern);
  auto malformed = [&]() {
    fail(
        "model.moe_layers = \"{}\" does not parse: write \"all\", \"every:N\" (every Nth layer), "
        "\"from:K\" (layers K to the last) or a list of layer indices such as \"1,3\" (\"\" for a "
        "dense model)",
        pattern);
  };
  if (p.empty()) return flags;
  if (p == "all") return std::vector<bool>(size_t(n), true);
  if (p.starts_with("every:")) {
    const int64_t every = parse_count(p.substr(6));
    if (every < 1) malformed();
    if (every > n)
      fail("model.moe_layers = \"{}\" names no layer: model.n_layer = {} has no layer {}", pattern,
           n, every - 1);
    for (int64_t l = every - 1; l < n; l += every) flags[size_t(l)] = true;
    return flags;
  }
  if (p.starts_with("from:")) {
    const int64_t from = parse_count(p.substr(5));
    if (from < 0) malformed();
    if (from >= n)
      fail(
          "model.moe_layers = \"{}\" names no layer: model.n_layer = {} (layers 0 to {}); write "
          "\"from:K\" with K below {}",
          pattern, n, n - 1, n);
    for (int64_t l = from; l < n; ++l) flags[size_t(l)] = true;
    return flags;
  }
  size_t begin = 0;
  while (begin <= p.size()) {
    size_t end = p.find(',', begin);
    if (end == std::string_view::npos) end = p.size();
    const int64_t layer = parse_count(p.substr(begin, end - begin));
    if (layer < 0) malformed();
    if (layer >= n)
      fail("model.moe_layers = \"{}\" names layer {}, but model.n_layer = {} (layers 0 to {})",
           pattern, layer, n, n - 1);
    flags[size_t(layer)] = true;
    begin = end + 1;
  }
  return flags;
}

}  // namespace

bool is_moe_layer(const ModelConfig& cfg, int64_t layer) {
  PENTAD_CHECK(0 <= layer && layer < cfg.n_layer, "layer {} of {}", layer, cfg.n_layer);
  return cfg.n_experts > 0 && moe_flags(cfg)[size_t(layer)];
}

std::vector<int64_t> moe_layer_indices(const ModelConfig& cfg) {
  std::vector<int64_t> layers;
  if (cfg.n_experts == 0) return layers;
  const std::vector<bool> flags = moe_flags(cfg);
  for (int64_t l = 0; l < cfg.n_layer; ++l)
    if (flags[size_t(l)]) layers.push_back(l);
  return layers;
}

int64_t expert_ffn_dim(const ModelConfig& cfg) {
  return cfg.d_ff_expert > 0 ? cfg.d_ff_expert : ffn_dim(cfg);
}

}  // namespace pentad
