#include "cli/convert.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sha256.h"
#include "cli/checkpoint_params.h"
#include "cli/hf_layout.h"
#include "core/check.h"
#include "core/progress.h"
#include "data/corpus.h"
#include "data/tokenizer.h"
#include "recipe/recipe.h"

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

// The fp32 bytes of every tensor of the table: the progress line's total.
int64_t table_bytes(const std::vector<HfEntry>& table) {
  int64_t values = 0;
  for (const HfEntry& e : table) values += numel(e.hf_shape());
  return values * static_cast<int64_t>(sizeof(float));
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

// The tokenizer that came with the model (tokenizer.json, else tokenizer.model), loaded to
// check it, and where it will be copied beside the checkpoint; "" when hf_dir has none.
std::string imported_tokenizer(const std::string& hf_dir, const std::string& checkpoint_root,
                               int64_t vocab_size, std::string& description) {
  for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
    const fs::path source = fs::path(hf_dir) / name;
    if (!fs::exists(source)) continue;
    const data::Tokenizer tokenizer = data::Tokenizer::load(source.string());
    if (tokenizer.vocab_size() > vocab_size)
      fail("{}: the tokenizer has {} tokens, more than config.json's vocab_size {}",
           source.string(), tokenizer.vocab_size(), vocab_size);
    description = fmt::format("{} ({}, {} tokens)", name, tokenizer.kind(), tokenizer.vocab_size());
    return fs::absolute(fs::path(checkpoint_root) / name).lexically_normal().string();
  }
  return "";
}

// What an earlier export (ours, or transformers' save_pretrained) left that this one would
// not replace: its weights (every *.safetensors and the shards' index, which transformers
// would load beside ours) and its tokenizer files.
void remove_previous_export(const std::string& out_dir) {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const fs::directory_entry& e : fs::directory_iterator(out_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() == ".safetensors" || name == "model.safetensors.index.json" ||
        name == "tokenizer.json" || name == "tokenizer_config.json" || name == "tokenizer.model" ||
        name == "special_tokens_map.json")
      stale.push_back(e.path());
  }
  for (const fs::path& p : stale) {
    fs::remove(p, ec);
    if (ec) fail("{}: cannot remove it to overwrite the export ({})", p.string(), ec.message());
  }
}

// The tokenizer an export takes: `chosen` (--tokenizer), else the one the checkpoint carries
// (its sha256 checked), else, for checkpoints from before they carried one, the recipe's file
// where it exists; "" for none.
std::string export_tokenizer(const CheckpointParams& ckpt, const std::string& chosen) {
  if (!chosen.empty()) return chosen;
  const std::string carried = carried_tokenizer(ckpt.dir(), ckpt.manifest());
  if (!carried.empty()) return carried;
  const std::string recipes = data::run_tokenizer(ckpt.config().data, ckpt.model().vocab_size);
  return !recipes.empty() && fs::exists(recipes) ? recipes : "";
}

// Writes the tokenizer at `path` into an export at out_dir and says what it wrote. A Hugging
// Face tokenizer.json goes as it is, with a tokenizer_config.json that names the class,
// the end-of-text (and beginning) token and the context, so that AutoTokenizer loads it. A
// SentencePiece model goes as tokenizer.model alone: which class reads it (LlamaTokenizer,
// T5Tokenizer, ...) and its special-token rules are the model's, which pentad does not know.
std::string write_hf_tokenizer(const std::string& path, const std::string& out_dir,
                               const ModelConfig& m) {
  const data::Tokenizer tokenizer = data::Tokenizer::load(path);
  if (tokenizer.vocab_size() > m.vocab_size)
    fail("{}: {} tokens, more than the model's model.vocab_size = {}", path, tokenizer.vocab_size(),
         m.vocab_size);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const std::string name = data::Tokenizer::file_name_for(bytes);
  const std::string target = (fs::path(out_dir) / name).string();
  std::ofstream out(target, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out.flush()) fail("{}: write failed ({})", target, std::strerror(errno));
  if (name == "tokenizer.model")
    return fmt::format(
        "tokenizer.model ({}, {} tokens; no tokenizer_config.json: choose the transformers "
        "class that reads it, e.g. LlamaTokenizer.from_pretrained)",
        tokenizer.kind(), tokenizer.vocab_size());
  nlohmann::json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                           {"model_max_length", m.max_seq_len},
                           {"clean_up_tokenization_spaces", false}};
  if (tokenizer.eot_id() >= 0) config["eos_token"] = tokenizer.token_bytes(tokenizer.eot_id());
  if (tokenizer.bos_id() >= 0) config["bos_token"] = tokenizer.token_bytes(tokenizer.bos_id());
  const std::string config_path = (fs::path(out_dir) / "tokenizer_config.json").string();
  std::ofstream config_out(config_path);
  config_out << config.dump(2) << "\n";
  if (!config_out.flush()) fail("{}: write failed ({})", config_path, std::strerror(errno));
  return fmt::format("tokenizer.json and tokenizer_config.json ({}, {} tokens)", tokenizer.kind(),
                     tokenizer.vocab_size());
}

// The recipe of an imported model, as written beside its checkpoint.
struct ImportedRecipe {
  Config cfg;
  std::string toml;                   // cfg as text: recipe.toml and the manifest's copy
  std::string tokenizer;              // data.tokenizer: where the model's goes; "" for none
  std::string tokenizer_description;  // what the model's tokenizer is, for the summary
};

// The recipe for the model hf_dir's config.json describes. Every key but the model's keeps
// its default; the recipe is validated like a file's.
ImportedRecipe import_recipe(const std::string& hf_dir, const std::string& checkpoint_root) {
  const std::string config_path = (fs::path(hf_dir) / "config.json").string();
  std::ifstream config_in(config_path);
  if (!config_in) fail("{}: cannot open ({})", config_path, std::strerror(errno));
  nlohmann::json hf_config;
  try {
    hf_config = nlohmann::json::parse(config_in);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: not valid JSON ({})", config_path, e.what());
  }
  ImportedRecipe r;
  Config cfg = parse_recipe("", config_path);
  cfg.model = model_from_hf(hf_config, config_path);
  cfg.train.seq_len = std::min(cfg.train.seq_len, cfg.model.max_seq_len);
  // The recipe names the model's own tokenizer and no data: training from it refuses until
  // data.source and data.path name the user's tokens, rather than train on the fortunes.
  r.tokenizer =
      imported_tokenizer(hf_dir, checkpoint_root, cfg.model.vocab_size, r.tokenizer_description);
  cfg.data.tokenizer = r.tokenizer;
  cfg.data.source = "none";
  r.toml = recipe_to_toml(cfg);
  r.cfg = parse_recipe(r.toml, config_path);
  return r;
}

// Refuses a step that exists, and a recipe.toml beside it for another model: the recipe goes
// beside the checkpoint, so that training starts from the two of them, and one already there
// is not overwritten.
void check_import_target(const std::string& target, const std::string& recipe_path,
                         const std::string& recipe) {
  if (fs::exists(target)) fail("{}: already exists; choose another root or step", target);
  if (fs::exists(recipe_path)) {
    std::ifstream in(recipe_path);
    const std::string there{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (there != recipe)
      fail("{}: holds a recipe for another model; choose another root", recipe_path);
  }
}

struct ImportedParams {
  std::vector<NamedTensor> params;  // pentad's names and shapes
  std::set<std::string> used;       // the stored tensors they were read from
  int64_t values = 0;               // values read
};

// Every parameter of m, cut from the stored tensor(s) the HF table maps it to; pentad's own
// state that transformers lacks starts neutral. Refuses a model with tensors missing.
ImportedParams read_hf_params(const HfTensors& hf, const ModelConfig& m,
                              const std::string& hf_dir) {
  ImportedParams r;
  std::vector<std::string> missing;
  const std::vector<HfEntry> table = hf_table(m);
  Progress progress("ckpt convert", table_bytes(table));
  for (size_t i = 0; i < table.size(); ++i) {
    const HfEntry& e = table[i];
    if (progress.due())
      progress.show(r.values * 4, fmt::format("{}/{} tensors read", i, table.size()));
    const std::string stored = hf.find(e.hf);
    if (stored.empty()) {
      missing.push_back(e.hf);
      continue;
    }
    r.used.insert(stored);
    const Dims shape = e.hf_shape();
    std::vector<float> data = hf.read(stored, shape);
    if (e.transposed) data = transpose(data, shape[0], shape[1]);
    size_t at = 0;
    for (const auto& [name, dims] : e.parts) {
      const size_t n = static_cast<size_t>(numel(dims));
      r.params.push_back({name, dims,
                          std::vector<float>(data.begin() + static_cast<std::ptrdiff_t>(at),
                                             data.begin() + static_cast<std::ptrdiff_t>(at + n))});
      at += n;
    }
    r.values += static_cast<int64_t>(data.size());
  }
  if (!missing.empty())
    fail("{}: missing tensors for the {} model config.json describes: {}", hf_dir, hf_model_type(m),
         fmt::join(missing, ", "));
  for (const auto& [name, dims] : pentad_only_params(m))
    r.params.push_back({name, dims, std::vector<float>(static_cast<size_t>(numel(dims)), 0.0f)});
  return r;
}

// How many stored tensors were skipped as not the model's: buffers that are not parameters
// (GPT-2's causal masks, old LLaMA rotary tables) and a tied model's stored copy of the
// embedding. Anything else left over means config.json and the weights disagree: refused.
size_t ignored_buffers(const HfTensors& hf, const std::set<std::string>& used, const ModelConfig& m,
                       const std::string& hf_dir) {
  static const std::regex buffer(
      R"((transformer\.)?h\.\d+\.attn\.(bias|masked_bias)|.*rotary_emb\.inv_freq)");
  std::vector<std::string> unused;
  size_t ignored = 0;
  for (const std::string& name : hf.names()) {
    if (used.count(name)) continue;
    if (std::regex_match(name, buffer) || (m.tie_embeddings && name == "lm_head.weight"))
      ++ignored;
    else
      unused.push_back(name);
  }
  if (!unused.empty())
    fail("{}: tensors the model in config.json does not use (n_layer or sizes wrong?): {}", hf_dir,
         fmt::join(unused, ", "));
  return ignored;
}

// Commits the parameters as step `step` of a one-rank checkpoint under checkpoint_root, its
// manifest carrying the recipe and the model's tokenizer.
void commit_imported(const std::vector<NamedTensor>& params, const std::string& checkpoint_root,
                     int64_t step, const ImportedRecipe& recipe, const std::string& hf_dir) {
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
  base.recipe_toml = recipe.toml;
  std::string tokenizer_bytes;  // the checkpoint carries the model's tokenizer too
  if (!recipe.tokenizer.empty()) {
    std::ifstream in(fs::path(hf_dir) / fs::path(recipe.tokenizer).filename(), std::ios::binary);
    tokenizer_bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    base.tokenizer_file = fs::path(recipe.tokenizer).filename().string();
    base.tokenizer_sha256 = sha256_hex(tokenizer_bytes);
  }
  remove_dirs(commit(checkpoint_root, base, 0, tokenizer_bytes));
}

// Writes recipe.toml and a copy of the model's tokenizer (to data.tokenizer) beside the
// checkpoint, and says what became of the tokenizer.
std::string write_beside_checkpoint(const ImportedRecipe& recipe, const std::string& recipe_path,
                                    const std::string& hf_dir) {
  std::ofstream recipe_out(recipe_path);
  recipe_out << recipe.toml;
  if (!recipe_out.flush()) fail("{}: write failed ({})", recipe_path, std::strerror(errno));
  if (recipe.tokenizer.empty())
    return fmt::format("{} has no tokenizer.json or tokenizer.model: data.tokenizer is empty",
                       hf_dir);
  std::error_code ec;
  fs::copy_file(fs::path(hf_dir) / fs::path(recipe.tokenizer).filename(), recipe.tokenizer,
                fs::copy_options::overwrite_existing, ec);
  if (ec) fail("{}: cannot copy the tokenizer there ({})", recipe.tokenizer, ec.message());
  return fmt::format("data.tokenizer = {}, copied from {}", recipe.tokenizer,
                     recipe.tokenizer_description);
}

}  // namespace

void refuse_to_replace(const std::string& out, bool overwrite) {
  std::error_code ec;
  if (!fs::exists(out, ec) || overwrite) return;
  if (fs::is_directory(out, ec) && fs::is_empty(out, ec)) return;
  std::string what = fs::is_directory(out, ec) ? "a non-empty directory" : "a file";
  const fs::path config = fs::path(out) / "config.json";
  if (fs::is_regular_file(config, ec)) {
    std::ifstream in(config);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_object() && j.contains("model_type") && j["model_type"].is_string())
      what = fmt::format("an export of a {} model", j["model_type"].get<std::string>());
  }
  fail(
      "{}: already exists ({}); ckpt convert replaces nothing: choose another destination, or "
      "pass --overwrite to replace it",
      out, what);
}

std::string export_hf(const std::string& checkpoint_dir, const std::string& out_dir, bool overwrite,
                      const std::string& tokenizer) {
  refuse_to_replace(out_dir, overwrite);
  CheckpointParams ckpt(checkpoint_dir);
  const ModelConfig& m = ckpt.model();
  check_hf_exportable(m, checkpoint_dir);
  const std::string tokenizer_path = export_tokenizer(ckpt, tokenizer);
  // The selection bias of aux-loss-free balancing has no place in Mixtral: at zero (never
  // updated) it changes no choice and is left out; otherwise transformers would route
  // tokens to other experts than pentad does.
  int64_t zero_biases = 0;
  for (const auto& [name, dims] : pentad_only_params(m)) {
    if (!ckpt.has(name)) continue;
    float largest = 0.0f;
    for (float b : ckpt.get(name, dims)) largest = std::max(largest, std::abs(b));
    if (largest != 0.0f)
      fail(
          "{}: param/{} is not zero (largest |value| {}): Mixtral's router has no selection "
          "bias, so transformers would pick other experts than pentad; a model trained with "
          "moe.bias_update_rate > 0 does not export to Mixtral",
          checkpoint_dir, name, largest);
    ++zero_biases;
  }
  if (zero_biases > 0)
    spdlog::warn("{}: leaving out {} all-zero expert_bias tensors (Mixtral has no selection bias)",
                 checkpoint_dir, zero_biases);
  if (m.is_moe() && m.moe.capacity_factor > 0.0f)
    spdlog::warn(
        "{}: moe.capacity_factor = {}: transformers' Mixtral drops no tokens, so its outputs "
        "differ from pentad's wherever an expert overflows",
        checkpoint_dir, m.moe.capacity_factor);
  std::vector<NamedTensor> tensors;
  int64_t values = 0;
  const std::vector<HfEntry> table = hf_table(m);
  Progress progress("ckpt convert", table_bytes(table));
  for (const HfEntry& e : table) {
    if (progress.due())
      progress.show(values * 4, fmt::format("{}/{} tensors read", tensors.size(), table.size()));
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
  if (overwrite) remove_previous_export(out_dir);
  const std::string weights = (fs::path(out_dir) / "model.safetensors").string();
  const std::string config = (fs::path(out_dir) / "config.json").string();
  // transformers refuses safetensors without format metadata.
  write_safetensors(weights, tensors, {{"format", "pt"}});
  std::ofstream config_out(config);
  config_out << hf_config(m).dump(2) << "\n";
  if (!config_out.flush()) fail("{}: write failed ({})", config, std::strerror(errno));
  const std::string tokenizer_note =
      tokenizer_path.empty()
          ? "no tokenizer: the checkpoint carries none and its recipe names none (pass "
            "--tokenizer FILE)"
          : fmt::format("the tokenizer from {} as {}", tokenizer_path,
                        write_hf_tokenizer(tokenizer_path, out_dir, m));
  return fmt::format("exported {} tensors ({} parameters, {} bytes) from {} to {} and {} ({}); {}",
                     tensors.size(), values, fs::file_size(weights), checkpoint_dir, weights,
                     config, hf_model_type(m), tokenizer_note);
}

std::string import_hf(const std::string& hf_dir, const std::string& checkpoint_root, int64_t step) {
  const ImportedRecipe recipe = import_recipe(hf_dir, checkpoint_root);
  const ModelConfig& m = recipe.cfg.model;
  const std::string target = checkpoint_dir(checkpoint_root, step);
  const std::string recipe_path = (fs::path(checkpoint_root) / "recipe.toml").string();
  check_import_target(target, recipe_path, recipe.toml);

  HfTensors hf(hf_dir);
  const ImportedParams imported = read_hf_params(hf, m, hf_dir);
  const size_t ignored = ignored_buffers(hf, imported.used, m, hf_dir);
  commit_imported(imported.params, checkpoint_root, step, recipe, hf_dir);
  const std::string tokenizer_note = write_beside_checkpoint(recipe, recipe_path, hf_dir);
  const std::string& tokenizer = recipe.tokenizer;
  return fmt::format(
      "imported {} tensors ({} parameters) from {} safetensors file(s) in {} into {} "
      "(ignored {} buffers); its recipe is {} (train on: pentad train {} --resume {} "
      "data.source=megatron data.path=PREFIX, PREFIX from pentad data prepare FILES "
      "--tokenizer {} -o PREFIX); {}",
      imported.params.size(), imported.values, hf.files(), hf_dir, target, ignored, recipe_path,
      recipe_path, target, tokenizer.empty() ? "TOKENIZER" : tokenizer, tokenizer_note);
}

}  // namespace pentad::ckpt
