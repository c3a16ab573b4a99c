#include "cli/convert.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "cli/checkpoint_params.h"
#include "core/check.h"
#include "model/model.h"
#include "train/recipe.h"

namespace pentad::ckpt {

namespace fs = std::filesystem;

namespace {

// A row-major (rows, cols) matrix as (cols, rows).
std::vector<float> transpose(const std::vector<float>& m, int64_t rows, int64_t cols) {
  std::vector<float> t(m.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      t[static_cast<size_t>(c * rows + r)] = m[static_cast<size_t>(r * cols + c)];
  return t;
}

// One HF tensor: pentad parameters stacked along their first (out) dim, then transposed
// for GPT-2's Conv1D ([in, out]). Most entries have one part; GPT-2's c_attn has q, k, v.
struct HfEntry {
  std::string hf;
  bool transposed = false;
  std::vector<std::pair<std::string, Dims>> parts;  // pentad name, shape

  Dims hf_shape() const {
    Dims stacked = parts[0].second;
    for (size_t i = 1; i < parts.size(); ++i) stacked[0] += parts[i].second[0];
    return transposed ? Dims{stacked[1], stacked[0]} : stacked;
  }
};

std::vector<HfEntry> hf_table(const ModelConfig& m) {
  const int64_t C = m.d_model, V = m.vocab_size, F = ffn_dim(m), T = m.max_seq_len;
  const int64_t Ckv = m.kv_heads() * m.head_dim();
  std::vector<HfEntry> t;
  auto one = [&](std::string hf, std::string ours, Dims dims, bool transposed = false) {
    t.push_back({std::move(hf), transposed, {{std::move(ours), std::move(dims)}}});
  };
  if (m.family == ModelFamily::GPT2) {
    // GPT2LMHeadModel keeps the body under "transformer." and the head beside it; a file
    // without the prefix loads only into the bare GPT2Model, so an untied head (or any
    // head) would make from_pretrained refuse it.
    one("transformer.wte.weight", "wte.weight", {V, C});
    one("transformer.wpe.weight", "wpe.weight", {T, C});
    for (int64_t l = 0; l < m.n_layer; ++l) {
      const std::string p = fmt::format("layers.{}.", l), h = fmt::format("transformer.h.{}.", l);
      one(h + "ln_1.weight", p + "norm1.weight", {C});
      one(h + "ln_1.bias", p + "norm1.bias", {C});
      // c_attn.weight [C, 3C] = [Wq^T Wk^T Wv^T]; c_attn.bias = [bq bk bv].
      t.push_back({h + "attn.c_attn.weight",
                   true,
                   {{p + "attn.q.weight", {C, C}},
                    {p + "attn.k.weight", {C, C}},
                    {p + "attn.v.weight", {C, C}}}});
      t.push_back({h + "attn.c_attn.bias",
                   false,
                   {{p + "attn.q.bias", {C}}, {p + "attn.k.bias", {C}}, {p + "attn.v.bias", {C}}}});
      one(h + "attn.c_proj.weight", p + "attn.o.weight", {C, C}, true);
      one(h + "attn.c_proj.bias", p + "attn.o.bias", {C});
      one(h + "ln_2.weight", p + "norm2.weight", {C});
      one(h + "ln_2.bias", p + "norm2.bias", {C});
      one(h + "mlp.c_fc.weight", p + "mlp.up.weight", {F, C}, true);
      one(h + "mlp.c_fc.bias", p + "mlp.up.bias", {F});
      one(h + "mlp.c_proj.weight", p + "mlp.down.weight", {C, F}, true);
      one(h + "mlp.c_proj.bias", p + "mlp.down.bias", {C});
    }
    one("transformer.ln_f.weight", "norm_f.weight", {C});
    one("transformer.ln_f.bias", "norm_f.bias", {C});
  } else {
    // pentad's RoPE pairs dimension i with i + d/2 (HF's rotate_half), the convention HF
    // LLaMA checkpoints are stored in, so q_proj and k_proj are copied without permutation.
    one("model.embed_tokens.weight", "wte.weight", {V, C});
    for (int64_t l = 0; l < m.n_layer; ++l) {
      const std::string p = fmt::format("layers.{}.", l), h = fmt::format("model.layers.{}.", l);
      one(h + "input_layernorm.weight", p + "norm1.weight", {C});
      one(h + "self_attn.q_proj.weight", p + "attn.q.weight", {C, C});
      one(h + "self_attn.k_proj.weight", p + "attn.k.weight", {Ckv, C});
      one(h + "self_attn.v_proj.weight", p + "attn.v.weight", {Ckv, C});
      one(h + "self_attn.o_proj.weight", p + "attn.o.weight", {C, C});
      one(h + "post_attention_layernorm.weight", p + "norm2.weight", {C});
      one(h + "mlp.gate_proj.weight", p + "mlp.gate.weight", {F, C});
      one(h + "mlp.up_proj.weight", p + "mlp.up.weight", {F, C});
      one(h + "mlp.down_proj.weight", p + "mlp.down.weight", {C, F});
    }
    one("model.norm.weight", "norm_f.weight", {C});
  }
  // A tied head is the embedding: transformers' save_pretrained leaves it out, and
  // tie_word_embeddings in config.json makes from_pretrained tie it again.
  if (!m.tie_embeddings) one("lm_head.weight", "lm_head.weight", {V, C});
  return t;
}

// A float as its shortest decimal (1e-05, not 9.999999747378752e-06), for config.json.
double decimal(float f) {
  return std::stod(fmt::format("{}", f));
}

nlohmann::ordered_json hf_config(const ModelConfig& m) {
  const int64_t F = ffn_dim(m);
  nlohmann::ordered_json c;
  if (m.family == ModelFamily::GPT2) {
    c["architectures"] = {"GPT2LMHeadModel"};
    c["model_type"] = "gpt2";
    c["vocab_size"] = m.vocab_size;
    c["n_positions"] = m.max_seq_len;
    c["n_ctx"] = m.max_seq_len;
    c["n_embd"] = m.d_model;
    c["n_layer"] = m.n_layer;
    c["n_head"] = m.n_head;
    c["n_inner"] = F == 4 * m.d_model ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(F);
    c["activation_function"] = "gelu_new";  // the tanh approximation pentad's GELU uses
    c["layer_norm_epsilon"] = decimal(m.norm_eps);
    // pentad trains without dropout; so does a model fine-tuned from this export.
    c["resid_pdrop"] = 0.0;
    c["embd_pdrop"] = 0.0;
    c["attn_pdrop"] = 0.0;
  } else {
    c["architectures"] = {"LlamaForCausalLM"};
    c["model_type"] = "llama";
    c["vocab_size"] = m.vocab_size;
    c["hidden_size"] = m.d_model;
    c["intermediate_size"] = F;
    c["num_hidden_layers"] = m.n_layer;
    c["num_attention_heads"] = m.n_head;
    c["num_key_value_heads"] = m.kv_heads();
    c["head_dim"] = m.head_dim();
    c["max_position_embeddings"] = m.max_seq_len;
    c["rms_norm_eps"] = decimal(m.norm_eps);
    c["rope_theta"] = decimal(m.rope_theta);
    c["rope_scaling"] = nullptr;
    c["hidden_act"] = "silu";
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
    c["attention_dropout"] = 0.0;
  }
  c["initializer_range"] = decimal(m.init_std);
  c["tie_word_embeddings"] = m.tie_embeddings;
  c["torch_dtype"] = "float32";
  return c;
}

// config.json -> pentad's model keys; refuses what pentad cannot represent.
ModelConfig model_from_hf(const nlohmann::json& c, const std::string& path) {
  auto has = [&](const char* key) { return c.contains(key) && !c[key].is_null(); };
  auto integer = [&](const char* key) -> int64_t {
    if (!has(key)) fail("{}: missing \"{}\"", path, key);
    if (!c[key].is_number_integer()) fail("{}: \"{}\" is not an integer", path, key);
    return c[key].get<int64_t>();
  };
  auto number = [&](const char* key, double otherwise) -> float {
    if (!has(key)) return static_cast<float>(otherwise);
    if (!c[key].is_number()) fail("{}: \"{}\" is not a number", path, key);
    return c[key].get<float>();
  };
  auto flag = [&](const char* key, bool otherwise) {
    if (!has(key)) return otherwise;
    if (!c[key].is_boolean()) fail("{}: \"{}\" is not true or false", path, key);
    return c[key].get<bool>();
  };
  auto word = [&](const char* key, const char* otherwise) -> std::string {
    if (!has(key)) return otherwise;
    if (!c[key].is_string()) fail("{}: \"{}\" is not a string", path, key);
    return c[key].get<std::string>();
  };

  if (!c.is_object()) fail("{}: not a JSON object", path);
  const std::string type = word("model_type", "");
  ModelConfig m;
  if (type == "gpt2") {
    m.family = ModelFamily::GPT2;
    m.d_model = integer("n_embd");
    m.n_layer = integer("n_layer");
    m.n_head = integer("n_head");
    m.vocab_size = integer("vocab_size");
    m.max_seq_len = has("n_positions") ? integer("n_positions") : integer("n_ctx");
    m.d_ff = has("n_inner") ? integer("n_inner") : 0;
    m.norm_eps = number("layer_norm_epsilon", 1e-5);
    m.tie_embeddings = flag("tie_word_embeddings", true);
    const std::string act = word("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      fail("{}: activation_function \"{}\": pentad's GPT-2 uses the tanh GELU (\"gelu_new\")", path,
           act);
  } else if (type == "llama") {
    m.family = ModelFamily::LLaMA;
    m.d_model = integer("hidden_size");
    m.n_layer = integer("num_hidden_layers");
    m.n_head = integer("num_attention_heads");
    m.n_kv_head = has("num_key_value_heads") ? integer("num_key_value_heads") : 0;
    if (m.n_kv_head == m.n_head) m.n_kv_head = 0;  // the recipe's spelling of plain MHA
    m.d_ff = integer("intermediate_size");
    m.vocab_size = integer("vocab_size");
    m.max_seq_len = has("max_position_embeddings") ? integer("max_position_embeddings") : 2048;
    m.norm_eps = number("rms_norm_eps", 1e-6);
    m.tie_embeddings = flag("tie_word_embeddings", false);
    // Newer transformers keep rope_theta in rope_parameters.
    const bool nested = has("rope_parameters") && c["rope_parameters"].is_object();
    const nlohmann::json& rope = nested ? c["rope_parameters"] : c;
    m.rope_theta = rope.contains("rope_theta") && rope["rope_theta"].is_number()
                       ? rope["rope_theta"].get<float>()
                       : 10000.0f;
    const bool scaled = has("rope_scaling") ||
                        (nested && rope.contains("rope_type") && rope["rope_type"] != "default");
    if (scaled) fail("{}: RoPE scaling is set; pentad implements plain RoPE only", path);
    if (word("hidden_act", "silu") != "silu")
      fail("{}: hidden_act \"{}\": pentad's LLaMA uses SiLU (SwiGLU)", path,
           word("hidden_act", ""));
    if (flag("attention_bias", false) || flag("mlp_bias", false))
      fail("{}: attention_bias / mlp_bias are set; pentad's LLaMA has no biases", path);
    if (has("head_dim") && m.n_head > 0 && integer("head_dim") * m.n_head != m.d_model)
      fail(
          "{}: head_dim {} x {} heads != hidden_size {}; pentad needs head_dim = hidden_size / "
          "num_attention_heads",
          path, integer("head_dim"), m.n_head, m.d_model);
  } else {
    fail("{}: model_type \"{}\" is not supported: pentad converts \"gpt2\" and \"llama\"", path,
         type);
  }
  m.init_std = number("initializer_range", 0.02);
  return m;
}

// One or more safetensors files seen as one table.
class HfTensors {
 public:
  explicit HfTensors(const std::string& dir) : dir_(dir) {
    std::vector<std::string> paths;
    if (fs::exists(fs::path(dir) / "model.safetensors")) {
      paths.push_back((fs::path(dir) / "model.safetensors").string());
    } else {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.path().extension() == ".safetensors") paths.push_back(e.path().string());
      std::sort(paths.begin(), paths.end());
    }
    if (paths.empty()) fail("{}: no model.safetensors or other *.safetensors file", dir);
    for (const std::string& p : paths) {
      files_.emplace_back(p);
      for (const auto& [name, entry] : files_.back().tensors()) {
        if (where_.count(name))
          fail("{}: tensor {} is in both {} and {}", dir, name, files_[where_[name]].path(), p);
        where_[name] = files_.size() - 1;
      }
    }
  }

  size_t files() const { return files_.size(); }
  // The stored name of `name` (as GPT2LMHeadModel or LlamaForCausalLM names it): itself,
  // or without the base model's prefix, as the bare GPT2Model / LlamaModel and older
  // exports store it; "" if absent.
  std::string find(const std::string& name) const {
    if (where_.count(name)) return name;
    for (const char* prefix : {"transformer.", "model."})
      if (name.starts_with(prefix) && where_.count(name.substr(std::strlen(prefix))))
        return name.substr(std::strlen(prefix));
    return "";
  }
  std::vector<float> read(const std::string& stored, const Dims& dims) const {
    const SafetensorsFile& f = files_[where_.at(stored)];
    const Dims& shape = f.tensors().at(stored).shape;
    if (shape != dims)
      fail("{}: tensor {} has shape [{}]; config.json implies [{}]", f.path(), stored,
           fmt::join(shape, ", "), fmt::join(dims, ", "));
    return f.read(stored);
  }
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (const auto& [name, file] : where_) n.push_back(name);
    return n;
  }

 private:
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index in files_
};

}  // namespace

std::string export_hf(const std::string& checkpoint_dir, const std::string& out_dir) {
  CheckpointParams ckpt(checkpoint_dir);
  const ModelConfig& m = ckpt.model();
  if (m.family == ModelFamily::GPT2 && m.kv_heads() != m.n_head)
    fail("{}: a GPT-2 with n_kv_head {} != n_head {} has no transformers equivalent",
         checkpoint_dir, m.kv_heads(), m.n_head);
  std::vector<NamedTensor> tensors;
  int64_t values = 0;
  for (const HfEntry& e : hf_table(m)) {
    std::vector<float> stacked;
    for (const auto& [name, dims] : e.parts) {
      std::vector<float> part = ckpt.get(name, dims);
      stacked.insert(stacked.end(), part.begin(), part.end());
    }
    const Dims shape = e.hf_shape();
    if (e.transposed) stacked = transpose(stacked, shape[1], shape[0]);
    values += static_cast<int64_t>(stacked.size());
    tensors.push_back({e.hf, shape, std::move(stacked)});
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) fail("{}: cannot create directory ({})", out_dir, ec.message());
  const std::string weights = (fs::path(out_dir) / "model.safetensors").string();
  const std::string config = (fs::path(out_dir) / "config.json").string();
  // transformers refuses safetensors without format metadata.
  write_safetensors(weights, tensors, {{"format", "pt"}});
  std::ofstream config_out(config);
  config_out << hf_config(m).dump(2) << "\n";
  if (!config_out.flush()) fail("{}: write failed ({})", config, std::strerror(errno));
  return fmt::format("exported {} tensors ({} parameters, {} bytes) from {} to {} and {}",
                     tensors.size(), values, fs::file_size(weights), checkpoint_dir, weights,
                     config);
}

std::string import_hf(const std::string& hf_dir, const std::string& checkpoint_root, int64_t step) {
  const std::string config_path = (fs::path(hf_dir) / "config.json").string();
  std::ifstream config_in(config_path);
  if (!config_in) fail("{}: cannot open ({})", config_path, std::strerror(errno));
  nlohmann::json hf_config;
  try {
    hf_config = nlohmann::json::parse(config_in);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: not valid JSON ({})", config_path, e.what());
  }
  // Every key but the model's keeps its default; the recipe is validated like a file's.
  Config cfg = parse_recipe("", config_path);
  cfg.model = model_from_hf(hf_config, config_path);
  cfg.train.seq_len = std::min(cfg.train.seq_len, cfg.model.max_seq_len);
  const std::string recipe = recipe_to_toml(cfg);
  cfg = parse_recipe(recipe, config_path);
  const ModelConfig& m = cfg.model;

  const std::string target = checkpoint_dir(checkpoint_root, step);
  if (fs::exists(target)) fail("{}: already exists; choose another root or step", target);
  // The recipe goes beside the checkpoint, so that training starts from the two of them;
  // one already there for another model is not overwritten.
  const std::string recipe_path = (fs::path(checkpoint_root) / "recipe.toml").string();
  if (fs::exists(recipe_path)) {
    std::ifstream in(recipe_path);
    const std::string there{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (there != recipe)
      fail("{}: holds a recipe for another model; choose another root", recipe_path);
  }

  HfTensors hf(hf_dir);
  std::vector<std::string> missing, used;
  std::vector<NamedTensor> params;
  int64_t values = 0;
  for (const HfEntry& e : hf_table(m)) {
    const std::string stored = hf.find(e.hf);
    if (stored.empty()) {
      missing.push_back(e.hf);
      continue;
    }
    used.push_back(stored);
    const Dims shape = e.hf_shape();
    std::vector<float> data = hf.read(stored, shape);
    if (e.transposed) data = transpose(data, shape[0], shape[1]);
    size_t at = 0;
    for (const auto& [name, dims] : e.parts) {
      const size_t n = static_cast<size_t>(numel(dims));
      params.push_back({name, dims,
                        std::vector<float>(data.begin() + static_cast<std::ptrdiff_t>(at),
                                           data.begin() + static_cast<std::ptrdiff_t>(at + n))});
      at += n;
    }
    values += static_cast<int64_t>(data.size());
  }
  if (!missing.empty())
    fail("{}: missing tensors for the {} model config.json describes: {}", hf_dir,
         m.family == ModelFamily::GPT2 ? "gpt2" : "llama", fmt::join(missing, ", "));

  // Buffers that are not parameters (GPT-2's causal masks, old LLaMA rotary tables) and a
  // tied model's stored copy of the embedding are skipped; anything else left over means
  // config.json and the weights disagree.
  static const std::regex buffer(
      R"((transformer\.)?h\.\d+\.attn\.(bias|masked_bias)|.*rotary_emb\.inv_freq)");
  std::vector<std::string> unused;
  size_t ignored = 0;
  for (const std::string& name : hf.names()) {
    if (std::find(used.begin(), used.end(), name) != used.end()) continue;
    if (std::regex_match(name, buffer) || (m.tie_embeddings && name == "lm_head.weight"))
      ++ignored;
    else
      unused.push_back(name);
  }
  if (!unused.empty())
    fail("{}: tensors the model in config.json does not use (n_layer or sizes wrong?): {}", hf_dir,
         fmt::join(unused, ", "));

  std::vector<ShardData> shards;
  for (const NamedTensor& p : params) {
    ShardData s;
    s.info.name = "param/" + p.name;
    s.info.global_shape = to_shape(p.shape);
    s.info.local_shape = s.info.global_shape;
    s.data = p.data.data();
    shards.push_back(s);
  }
  write_rank_file((fs::path(partial_dir(checkpoint_root, step)) / rank_file_name(0)).string(),
                  shards);
  Manifest base;
  base.step = step;
  base.recipe_toml = recipe;
  remove_dirs(commit(checkpoint_root, base, 0));
  std::ofstream recipe_out(recipe_path);
  recipe_out << recipe;
  if (!recipe_out.flush()) fail("{}: write failed ({})", recipe_path, std::strerror(errno));
  return fmt::format(
      "imported {} tensors ({} parameters) from {} safetensors file(s) in {} into {} "
      "(ignored {} buffers); its recipe is {} (train on: pentad train {} --resume {})",
      params.size(), values, hf.files(), hf_dir, target, ignored, recipe_path, recipe_path, target);
}

}  // namespace pentad::ckpt
