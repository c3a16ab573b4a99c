#include "recipe/checkpoint_recipe.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <sstream>

#include "model/model.h"
#include "recipe/recipe.h"

namespace pentad {
namespace {

// Every "<section>.<name>" -> value text of a recipe written by recipe_to_toml (one key a
// line, values in one canonical spelling), so that equal values are equal text.
std::map<std::string, std::string> recipe_values(const std::string& toml) {
  std::map<std::string, std::string> values;
  std::istringstream lines(toml);
  std::string line, section;
  while (std::getline(lines, line)) {
    if (line.empty() || line.front() == '#') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) values[section + "." + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return values;
}

// Keys that define what the weights compute, or which ids the tokens get. init_std only
// draws the first weights and recompute gives bitwise the same gradients: both may change.
constexpr const char* kModelKeys[] = {
    "model.family",           "model.n_layer",    "model.d_model",        "model.n_head",
    "model.n_kv_head",        "model.d_ff",       "model.vocab_size",     "model.max_seq_len",
    "model.norm_eps",         "model.rope_theta", "model.tie_embeddings", "data.tokenizer",
    "model.moe_layers",       "model.n_experts",  "model.top_k",          "model.d_ff_expert",
    "model.n_shared_experts", "moe.score",        "moe.renormalize",
};

bool is_model_key(const std::string& key) {
  return std::find(std::begin(kModelKeys), std::end(kModelKeys), key) != std::end(kModelKeys);
}

// A value as the model reads it: n_kv_head = 0 means as many as n_head, and d_ff = 0 the
// family's width rule (ffn_dim), so that a recipe spelling the number out (as an imported
// checkpoint does) matches one that leaves the default.
std::string effective(const std::map<std::string, std::string>& values, const std::string& key) {
  auto get = [&](const std::string& k) {
    auto it = values.find(k);
    return it == values.end() ? std::string() : it->second;
  };
  const std::string value = get(key);
  if (value != "0") return value;
  if (key == "model.n_kv_head") return get("model.n_head");
  if (key == "model.d_ff_expert")  // 0: the expert width follows d_ff and the family
    return get("model.n_experts") == "0" ? value : effective(values, "model.d_ff");
  if (key == "model.d_ff") {
    ModelConfig m;
    m.family = get("model.family") == "\"llama\"" ? ModelFamily::LLaMA : ModelFamily::GPT2;
    const std::string width = get("model.d_model");
    m.d_model = 0;  // stays 0 where the text is malformed
    std::from_chars(width.data(), width.data() + width.size(), m.d_model);
    return std::to_string(ffn_dim(m));
  }
  return value;
}

}  // namespace

RecipeComparison compare_recipes(const Config& run, const std::string& checkpoint_recipe_toml) {
  std::map<std::string, std::string> mine = recipe_values(recipe_to_toml(run));
  std::map<std::string, std::string> theirs = recipe_values(checkpoint_recipe_toml);
  // A checkpoint written before MoE existed holds a dense model: its missing MoE keys mean
  // their defaults (other keys an older recipe lacks are not compared).
  for (const auto& [key, value] : recipe_values(recipe_to_toml(Config{})))
    if (is_model_key(key) &&
        (key.starts_with("moe.") || key == "model.moe_layers" || key == "model.n_experts"))
      theirs.emplace(key, value);
  RecipeComparison result;
  for (const auto& [key, value] : mine) {
    auto it = theirs.find(key);
    if (it == theirs.end()) continue;
    // How a run starts is not part of what it trains.
    if (key == "train.resume" || key == "train.init_from") continue;
    if (effective(mine, key) == effective(theirs, key)) continue;
    const bool model = is_model_key(key) && !(key == "data.tokenizer" && it->second == "\"\"");
    (model ? result.model : result.other).push_back({key, value, it->second});
  }
  return result;
}

std::string describe_changes(const std::vector<RecipeChange>& changes) {
  std::string text;
  for (const RecipeChange& c : changes)
    text += fmt::format("\n  {}: {} in this recipe, {} in the checkpoint", c.key, c.run_value,
                        c.checkpoint_value);
  return text;
}

}  // namespace pentad
