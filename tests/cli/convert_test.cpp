// `pentad ckpt convert`: pentad <-> Hugging Face, pentad -> llm.c.
#include "cli/convert.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "model/model.h"
#include "recipe/recipe.h"

namespace fs = std::filesystem;
using namespace pentad;
using namespace pentad::ckpt;

namespace {

std::string fresh_dir(const std::string& tag) {
  const fs::path dir =
      fs::temp_directory_path() / ("pentad_convert_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

Config tiny(ModelFamily family, bool tied, int64_t n_kv_head = 0) {
  Config c = parse_recipe("", "test");
  c.model.family = family;
  c.model.n_layer = 2;
  c.model.d_model = 8;
  c.model.n_head = 2;
  c.model.n_kv_head = n_kv_head;
  c.model.d_ff = family == ModelFamily::LLaMA ? 12 : 0;
  c.model.vocab_size = 24;
  c.model.max_seq_len = 16;
  c.model.norm_eps = 1e-6f;
  if (family == ModelFamily::LLaMA) c.model.rope_theta = 500000.0f;  // unused by gpt2
  c.model.tie_embeddings = tied;
  c.train.seq_len = 16;
  return parse_recipe(recipe_to_toml(c), "test");  // validated
}

// An MoE llama of Mixtral's shape: experts in every layer, GQA, experts of their own width.
Config tiny_mixtral(bool tied) {
  Config c = tiny(ModelFamily::LLaMA, tied, 1);
  c.model.d_ff = 0;  // no dense MLP: import leaves the dense width at its default
  c.model.moe_layers = "all";
  c.model.n_experts = 3;
  c.model.top_k = 2;
  c.model.d_ff_expert = 6;
  c.model.moe.aux_loss_coef = 0.01f;
  return parse_recipe(recipe_to_toml(c), "test");
}

// The parameters of `cfg` as build_params names them, filled with random values (norms and
// biases too, so a mix-up between any two tensors shows).
struct Params {
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<std::vector<float>> values;
};

Params random_params(const Config& cfg, uint32_t seed) {
  Model model(cfg.model, 1, 1);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Params p;
  for (const ParamSpec& s : model.params().specs()) {
    p.names.push_back(s.name);
    p.shapes.push_back(s.global_shape);
    std::vector<float> v(static_cast<size_t>(s.global_shape.numel()));
    // The aux-loss-free selection bias stays zero, as Mixtral export requires (and as a
    // model trained without moe.bias_update_rate keeps it).
    if (!s.name.ends_with(".moe.expert_bias"))
      for (float& x : v) x = normal(rng);
    p.values.push_back(std::move(v));
  }
  return p;
}

std::string write_checkpoint(const std::string& root, const Config& cfg, const Params& p,
                             int64_t step) {
  std::vector<ShardData> shards;
  for (size_t i = 0; i < p.names.size(); ++i) {
    ShardData s;
    s.info.name = "param/" + p.names[i];
    s.info.global_shape = p.shapes[i];
    s.info.local_shape = p.shapes[i];
    s.data = p.values[i].data();
    shards.push_back(s);
  }
  write_rank_file(partial_dir(root, step) + "/" + rank_file_name(0), shards);
  Manifest m;
  m.step = step;
  m.recipe_toml = recipe_to_toml(cfg);
  remove_dirs(commit(root, m, 0));
  return checkpoint_dir(root, step);
}

// Every parameter in dir equals p bit for bit, and dir holds nothing else.
void expect_same_params(const std::string& dir, const Params& p) {
  Reader r(dir);
  EXPECT_EQ(r.tensor_names().size(), p.names.size());
  for (size_t i = 0; i < p.names.size(); ++i) {
    std::vector<float> got(p.values[i].size());
    r.read("param/" + p.names[i], p.shapes[i], -1, 0, p.shapes[i], got.data());
    EXPECT_EQ(std::memcmp(got.data(), p.values[i].data(), got.size() * sizeof(float)), 0)
        << p.names[i];
  }
}

const std::vector<float>& value(const Params& p, const std::string& name) {
  for (size_t i = 0; i < p.names.size(); ++i)
    if (p.names[i] == name) return p.values[i];
  ADD_FAILURE() << "no parameter " << name;
  return p.values[0];
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void round_trip(const std::string& tag, const Config& cfg) {
  const std::string work = fresh_dir(tag);
  const Params p = random_params(cfg, 7);
  const std::string src = write_checkpoint(work + "/a", cfg, p, 42);
  export_hf(src, work + "/hf");
  import_hf(work + "/hf", work + "/b");
  const std::string dst = checkpoint_dir(work + "/b", 0);
  expect_same_params(dst, p);
  Reader r(dst);
  EXPECT_EQ(r.manifest().step, 0);
  const Config back = parse_recipe(r.manifest().recipe_toml, "back");
  Config want, got;  // the model keys come back; the others are defaults by design
  want.model = cfg.model;
  got.model = back.model;
  EXPECT_EQ(recipe_to_toml(got), recipe_to_toml(want));
  // The same recipe beside the checkpoint, to train on from it.
  std::ifstream in(work + "/b/recipe.toml");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()),
            r.manifest().recipe_toml);
  fs::remove_all(work);
}

}  // namespace

// ---- pentad <-> Hugging Face ----

TEST(ConvertHf, Gpt2RoundTripIsBitwise) {
  round_trip("gpt2", tiny(ModelFamily::GPT2, true));
}
TEST(ConvertHf, Gpt2UntiedRoundTripIsBitwise) {
  round_trip("gpt2u", tiny(ModelFamily::GPT2, false));
}
TEST(ConvertHf, LlamaRoundTripIsBitwise) {
  round_trip("llama", tiny(ModelFamily::LLaMA, false, 1));
}
TEST(ConvertHf, LlamaTiedRoundTripIsBitwise) {
  round_trip("llamat", tiny(ModelFamily::LLaMA, true));
}

TEST(ConvertHf, MixtralRoundTripIsBitwise) {
  round_trip("mixtral", tiny_mixtral(false));
}
TEST(ConvertHf, MixtralTiedRoundTripIsBitwise) {
  round_trip("mixtralt", tiny_mixtral(true));
}

// The HF side is what transformers expects, checked element by element.
TEST(ConvertHf, Gpt2LayoutIsConv1D) {
  const std::string work = fresh_dir("gpt2layout");
  const Config cfg = tiny(ModelFamily::GPT2, true);
  const Params p = random_params(cfg, 3);
  export_hf(write_checkpoint(work + "/a", cfg, p, 1), work + "/hf");
  SafetensorsFile st(work + "/hf/model.safetensors");
  EXPECT_EQ(st.metadata().at("format"), "pt");
  EXPECT_EQ(st.tensors().size(), 4u + 12u * 2u);  // wte wpe ln_f.{w,b}; 12 per layer
  EXPECT_FALSE(st.has("lm_head.weight"));
  const int64_t C = 8, F = 32;
  EXPECT_EQ(st.tensors().at("transformer.h.1.attn.c_attn.weight").shape,
            (std::vector<int64_t>{C, 3 * C}));
  EXPECT_EQ(st.tensors().at("transformer.h.1.mlp.c_fc.weight").shape, (std::vector<int64_t>{C, F}));
  EXPECT_EQ(st.tensors().at("transformer.h.1.mlp.c_proj.weight").shape,
            (std::vector<int64_t>{F, C}));
  const std::vector<float> attn = st.read("transformer.h.1.attn.c_attn.weight");  // [in, 3C]
  const std::vector<float>& wk = value(p, "layers.1.attn.k.weight");              // (out, in)
  const std::vector<float>& wv = value(p, "layers.1.attn.v.weight");
  EXPECT_EQ(attn[2 * 3 * C + C + 5], wk[5 * C + 2]);      // row in=2, k's out=5
  EXPECT_EQ(attn[7 * 3 * C + 2 * C + 0], wv[0 * C + 7]);  // row in=7, v's out=0
  const std::vector<float> bias = st.read("transformer.h.1.attn.c_attn.bias");
  EXPECT_EQ(bias[C + 3], value(p, "layers.1.attn.k.bias")[3]);
  const std::vector<float> proj = st.read("transformer.h.0.attn.c_proj.weight");  // [in, out]
  EXPECT_EQ(proj[6 * C + 1], value(p, "layers.0.attn.o.weight")[1 * C + 6]);
  const std::vector<float> up = st.read("transformer.h.1.mlp.c_fc.weight");  // [C, F]
  EXPECT_EQ(up[5 * F + 20], value(p, "layers.1.mlp.up.weight")[20 * C + 5]);
  const std::vector<float> fc = st.read("transformer.h.0.mlp.c_proj.weight");  // [F, C]
  EXPECT_EQ(fc[17 * C + 3], value(p, "layers.0.mlp.down.weight")[3 * F + 17]);
  EXPECT_EQ(st.read("transformer.ln_f.bias"), value(p, "norm_f.bias"));
  const nlohmann::json c = read_json(work + "/hf/config.json");
  EXPECT_EQ(c["model_type"], "gpt2");
  EXPECT_EQ(c["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(c["n_embd"], C);
  EXPECT_EQ(c["n_layer"], 2);
  EXPECT_EQ(c["n_head"], 2);
  EXPECT_EQ(c["n_positions"], 16);
  EXPECT_EQ(c["vocab_size"], 24);
  EXPECT_TRUE(c["n_inner"].is_null());
  EXPECT_EQ(c["activation_function"], "gelu_new");
  EXPECT_EQ(c["layer_norm_epsilon"], 1e-6);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  fs::remove_all(work);
}

TEST(ConvertHf, LlamaNamesAndConfig) {
  const std::string work = fresh_dir("llamalayout");
  const Config cfg = tiny(ModelFamily::LLaMA, false, 1);
  const Params p = random_params(cfg, 5);
  export_hf(write_checkpoint(work + "/a", cfg, p, 1), work + "/hf");
  SafetensorsFile st(work + "/hf/model.safetensors");
  EXPECT_EQ(st.tensors().size(), 3u + 9u * 2u);
  EXPECT_EQ(st.tensors().at("model.layers.1.self_attn.k_proj.weight").shape,
            (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(st.read("model.layers.1.self_attn.k_proj.weight"), value(p, "layers.1.attn.k.weight"));
  EXPECT_EQ(st.read("model.layers.0.mlp.gate_proj.weight"), value(p, "layers.0.mlp.gate.weight"));
  EXPECT_EQ(st.read("lm_head.weight"), value(p, "lm_head.weight"));
  const nlohmann::json c = read_json(work + "/hf/config.json");
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(c["hidden_size"], 8);
  EXPECT_EQ(c["intermediate_size"], 12);
  EXPECT_EQ(c["num_hidden_layers"], 2);
  EXPECT_EQ(c["num_attention_heads"], 2);
  EXPECT_EQ(c["num_key_value_heads"], 1);
  EXPECT_EQ(c["max_position_embeddings"], 16);
  EXPECT_EQ(c["rope_theta"], 500000.0);
  EXPECT_EQ(c["rms_norm_eps"], 1e-6);
  EXPECT_EQ(c["hidden_act"], "silu");
  EXPECT_EQ(c["attention_bias"], false);
  EXPECT_EQ(c["tie_word_embeddings"], false);
  fs::remove_all(work);
}

// MixtralForCausalLM's names: w1 is pentad's gate, w2 its down, w3 its up; expert_bias is
// pentad's alone.
TEST(ConvertHf, MixtralNamesAndConfig) {
  const std::string work = fresh_dir("mixtrallayout");
  const Config cfg = tiny_mixtral(false);
  const Params p = random_params(cfg, 29);
  const std::string summary = export_hf(write_checkpoint(work + "/a", cfg, p, 1), work + "/hf");
  EXPECT_NE(summary.find("(mixtral)"), std::string::npos) << summary;
  SafetensorsFile st(work + "/hf/model.safetensors");
  // embed, norm, head; per layer 4 attention, 2 norms, the router and 3 experts x 3.
  EXPECT_EQ(st.tensors().size(), 3u + (6u + 1u + 9u) * 2u);
  for (const auto& [name, e] : st.tensors()) {
    EXPECT_EQ(name.find("expert_bias"), std::string::npos) << name;
    EXPECT_EQ(name.find(".mlp."), std::string::npos) << name;
  }
  const std::string h = "model.layers.1.block_sparse_moe.";
  EXPECT_EQ(st.tensors().at(h + "gate.weight").shape, (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(st.tensors().at(h + "experts.2.w1.weight").shape, (std::vector<int64_t>{6, 8}));
  EXPECT_EQ(st.tensors().at(h + "experts.2.w2.weight").shape, (std::vector<int64_t>{8, 6}));
  EXPECT_EQ(st.tensors().at(h + "experts.2.w3.weight").shape, (std::vector<int64_t>{6, 8}));
  EXPECT_EQ(st.read(h + "gate.weight"), value(p, "layers.1.moe.router.weight"));
  EXPECT_EQ(st.read(h + "experts.2.w1.weight"), value(p, "layers.1.moe.experts.2.gate.weight"));
  EXPECT_EQ(st.read(h + "experts.2.w2.weight"), value(p, "layers.1.moe.experts.2.down.weight"));
  EXPECT_EQ(st.read(h + "experts.2.w3.weight"), value(p, "layers.1.moe.experts.2.up.weight"));
  EXPECT_EQ(st.read("model.layers.0.block_sparse_moe.experts.0.w1.weight"),
            value(p, "layers.0.moe.experts.0.gate.weight"));
  EXPECT_EQ(st.read("model.layers.0.self_attn.k_proj.weight"), value(p, "layers.0.attn.k.weight"));
  const nlohmann::json c = read_json(work + "/hf/config.json");
  EXPECT_EQ(c["model_type"], "mixtral");
  EXPECT_EQ(c["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ(c["num_local_experts"], 3);
  EXPECT_EQ(c["num_experts_per_tok"], 2);
  EXPECT_EQ(c["intermediate_size"], 6);
  EXPECT_EQ(c["router_aux_loss_coef"], 0.01);
  EXPECT_EQ(c["output_router_logits"], false);
  EXPECT_TRUE(c["sliding_window"].is_null());
  EXPECT_EQ(c["num_key_value_heads"], 1);
  EXPECT_EQ(c["rope_theta"], 500000.0);
  EXPECT_EQ(c["tie_word_embeddings"], false);
  fs::remove_all(work);
}

// Mixtral routes every layer by softmax, top k, renormalised, with no shared experts and no
// selection bias; any other MoE is refused by the key that makes it different.
TEST(ConvertHf, MixtralExportRefusesOtherRouting) {
  const std::string work = fresh_dir("mixtralrefuse");
  int variant = 0;
  auto export_error = [&](const Config& cfg, bool biased = false) {
    Params p = random_params(cfg, 31);
    if (biased)
      for (size_t i = 0; i < p.names.size(); ++i)
        if (p.names[i] == "layers.1.moe.expert_bias") p.values[i][2] = 0.25f;
    const std::string root = work + "/v" + std::to_string(variant++);
    const std::string dir = write_checkpoint(root, cfg, p, 1);
    return error_of([&] { export_hf(dir, root + "/hf"); });
  };
  auto with = [](const std::string& override) {
    return parse_recipe(recipe_to_toml(tiny_mixtral(false)), "test", {override});
  };
  std::string msg = export_error(with("model.n_shared_experts=1"));
  EXPECT_NE(msg.find("model.n_shared_experts = 1"), std::string::npos) << msg;
  msg = export_error(with("moe.score=sigmoid"));
  EXPECT_NE(msg.find("moe.score = \"sigmoid\""), std::string::npos) << msg;
  msg = export_error(with("moe.renormalize=false"));
  EXPECT_NE(msg.find("moe.renormalize = false"), std::string::npos) << msg;
  msg = export_error(with("model.moe_layers=\"1\""));
  EXPECT_NE(msg.find("model.moe_layers = \"1\" makes 1 of 2 layers MoE"), std::string::npos) << msg;
  msg = export_error(tiny_mixtral(false), true);
  EXPECT_NE(msg.find("param/layers.1.moe.expert_bias is not zero (largest |value| 0.25)"),
            std::string::npos)
      << msg;
  msg = export_error(parse_recipe(recipe_to_toml(tiny(ModelFamily::GPT2, true)), "test",
                                  {"model.moe_layers=all", "model.n_experts=2"}));
  EXPECT_NE(msg.find("transformers has no GPT-2 with experts"), std::string::npos) << msg;
  // Every layer MoE by another spelling is Mixtral too.
  const Config listed = with("model.moe_layers=\"0,1\"");
  const std::string dir = write_checkpoint(work + "/listed", listed, random_params(listed, 3), 1);
  EXPECT_NO_THROW(export_hf(dir, work + "/listed/hf"));
  fs::remove_all(work);
}

// What a Mixtral config.json says, in pentad's keys; transformers' defaults for absent keys;
// a sliding window shorter than the context is refused.
TEST(ConvertHf, MixtralImportKeys) {
  const std::string work = fresh_dir("mixtralimport");
  const Config cfg = tiny_mixtral(false);
  export_hf(write_checkpoint(work + "/a", cfg, random_params(cfg, 37), 1), work + "/hf");
  nlohmann::json c = read_json(work + "/hf/config.json");
  int variant = 0;
  auto import_with = [&](const nlohmann::json& config) {
    const std::string dir = work + "/v" + std::to_string(variant++);
    fs::create_directories(dir);
    fs::copy_file(work + "/hf/model.safetensors", dir + "/model.safetensors");
    std::ofstream(dir + "/config.json") << config.dump();
    const std::string root = work + "/out" + std::to_string(variant);
    import_hf(dir, root);
    return parse_recipe(Reader(checkpoint_dir(root, 0)).manifest().recipe_toml, "back").model;
  };
  c["router_aux_loss_coef"] = 0.125;
  c.erase("rope_theta");
  c.erase("rms_norm_eps");
  const ModelConfig m = import_with(c);
  EXPECT_EQ(m.family, ModelFamily::LLaMA);
  EXPECT_EQ(m.moe_layers, "all");
  EXPECT_EQ(m.n_experts, 3);
  EXPECT_EQ(m.top_k, 2);
  EXPECT_EQ(m.d_ff_expert, 6);
  EXPECT_EQ(m.n_shared_experts, 0);
  EXPECT_EQ(m.moe.score, MoeScore::Softmax);
  EXPECT_TRUE(m.moe.renormalize);
  EXPECT_EQ(m.moe.aux_loss_coef, 0.125f);
  EXPECT_EQ(m.rope_theta, 1e6f);  // MixtralConfig's defaults, not LlamaConfig's
  EXPECT_EQ(m.norm_eps, 1e-5f);
  c["sliding_window"] = 16;  // as long as the context: no window in effect
  EXPECT_NO_THROW(import_with(c));
  c["sliding_window"] = 8;
  std::string msg = error_of([&] { import_with(c); });
  EXPECT_NE(msg.find("sliding_window 8 < max_position_embeddings 16"), std::string::npos) << msg;
  c["sliding_window"] = nullptr;
  c["num_experts_per_tok"] = 4;
  msg = error_of([&] { import_with(c); });
  EXPECT_NE(msg.find("num_experts_per_tok 4 of num_local_experts 3"), std::string::npos) << msg;
  fs::remove_all(work);
}

// An untied GPT-2 is the case GPT2LMHeadModel.from_pretrained refused while the body was
// stored without "transformer.": the head sits beside the prefixed body.
TEST(ConvertHf, Gpt2UntiedHeadBesideThePrefixedBody) {
  const std::string work = fresh_dir("gpt2untied");
  const Config cfg = tiny(ModelFamily::GPT2, false);
  const Params p = random_params(cfg, 23);
  export_hf(write_checkpoint(work + "/a", cfg, p, 1), work + "/hf");
  SafetensorsFile st(work + "/hf/model.safetensors");
  EXPECT_EQ(st.tensors().size(), 5u + 12u * 2u);
  for (const auto& [name, e] : st.tensors())
    EXPECT_TRUE(name == "lm_head.weight" || name.starts_with("transformer.")) << name;
  EXPECT_EQ(st.read("lm_head.weight"), value(p, "lm_head.weight"));
  EXPECT_EQ(st.read("transformer.wte.weight"), value(p, "wte.weight"));
  EXPECT_EQ(read_json(work + "/hf/config.json")["tie_word_embeddings"], false);
  fs::remove_all(work);
}

// Files from elsewhere differ from pentad's export: names without the base model's prefix
// (the bare GPT2Model / LlamaModel, older exports), attention-mask buffers, a stored copy
// of a tied head, several shard files.
TEST(ConvertHf, ImportAcceptsUnprefixedNamesAndBuffers) {
  const std::string work = fresh_dir("prefix");
  const Config cfg = tiny(ModelFamily::GPT2, true);
  const Params p = random_params(cfg, 11);
  export_hf(write_checkpoint(work + "/a", cfg, p, 1), work + "/hf");
  SafetensorsFile st(work + "/hf/model.safetensors");
  std::vector<NamedTensor> renamed;
  for (const auto& [name, e] : st.tensors()) {
    ASSERT_TRUE(name.starts_with("transformer.")) << name;
    renamed.push_back({name.substr(std::strlen("transformer.")), e.shape, st.read(name)});
  }
  renamed.push_back({"h.0.attn.bias", {1, 1, 16, 16}, std::vector<float>(256, 1.0f)});
  renamed.push_back({"transformer.h.1.attn.masked_bias", {}, {-1e4f}});
  renamed.push_back({"lm_head.weight", {24, 8}, st.read("transformer.wte.weight")});
  fs::create_directories(work + "/hf2");
  fs::copy_file(work + "/hf/config.json", work + "/hf2/config.json");
  // Split over two shard files, as large models are stored.
  std::vector<NamedTensor> half(renamed.begin() + 10, renamed.end());
  renamed.resize(10);
  write_safetensors(work + "/hf2/model-00001-of-00002.safetensors", renamed);
  write_safetensors(work + "/hf2/model-00002-of-00002.safetensors", half);
  const std::string summary = import_hf(work + "/hf2", work + "/b", 5);
  EXPECT_NE(summary.find("2 safetensors file(s)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("ignored 3"), std::string::npos) << summary;
  expect_same_params(checkpoint_dir(work + "/b", 5), p);
  fs::remove_all(work);
}

TEST(ConvertHf, ImportRefusesWhatItCannotRepresent) {
  const std::string work = fresh_dir("refuse");
  const Config cfg = tiny(ModelFamily::GPT2, true);
  const Params p = random_params(cfg, 13);
  export_hf(write_checkpoint(work + "/a", cfg, p, 1), work + "/hf");
  const nlohmann::json config = read_json(work + "/hf/config.json");
  SafetensorsFile st(work + "/hf/model.safetensors");
  std::vector<NamedTensor> all;
  for (const auto& [name, e] : st.tensors()) all.push_back({name, e.shape, st.read(name)});
  // A variant of the exported directory: config edited, tensors filtered or added.
  int variant = 0;
  auto import_variant = [&](const nlohmann::json& c, const std::vector<NamedTensor>& tensors) {
    const std::string dir = work + "/v" + std::to_string(variant++);
    fs::create_directories(dir);
    std::ofstream(dir + "/config.json") << c.dump();
    write_safetensors(dir + "/model.safetensors", tensors);
    return error_of([&] { import_hf(dir, work + "/out" + std::to_string(variant)); });
  };
  auto without = [&](const std::string& name) {
    std::vector<NamedTensor> t;
    for (const NamedTensor& x : all)
      if (x.name != name) t.push_back(x);
    return t;
  };
  nlohmann::json c = config;
  c["model_type"] = "mistral";
  EXPECT_NE(import_variant(c, all).find("model_type \"mistral\" is not supported"),
            std::string::npos);
  c = config;
  c.erase("n_embd");
  EXPECT_NE(import_variant(c, all).find("missing \"n_embd\""), std::string::npos);
  c = config;
  c["activation_function"] = "relu";
  EXPECT_NE(import_variant(c, all).find("activation_function \"relu\""), std::string::npos);
  std::string msg = import_variant(config, without("transformer.h.1.mlp.c_fc.bias"));
  EXPECT_NE(msg.find("missing tensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("h.1.mlp.c_fc.bias"), std::string::npos) << msg;
  c = config;
  c["n_layer"] = 1;
  msg = import_variant(c, all);
  EXPECT_NE(msg.find("does not use"), std::string::npos) << msg;
  EXPECT_NE(msg.find("h.1.ln_1.weight"), std::string::npos) << msg;
  c = config;
  c["n_positions"] = 12;
  c["n_ctx"] = 12;
  msg = import_variant(c, all);
  EXPECT_NE(msg.find("wpe.weight has shape [16, 8]; config.json implies [12, 8]"),
            std::string::npos)
      << msg;
  const nlohmann::json llama = {{"model_type", "llama"},
                                {"hidden_size", 8},
                                {"intermediate_size", 12},
                                {"num_hidden_layers", 1},
                                {"num_attention_heads", 2},
                                {"vocab_size", 24},
                                {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}}};
  EXPECT_NE(import_variant(llama, all).find("RoPE scaling"), std::string::npos);
  // An existing checkpoint is never overwritten, nor a recipe for another model.
  const std::string summary = import_hf(work + "/hf", work + "/same");
  EXPECT_NE(summary.find(work + "/same/recipe.toml"), std::string::npos) << summary;
  EXPECT_NE(error_of([&] { import_hf(work + "/hf", work + "/same"); }).find("already exists"),
            std::string::npos);
  EXPECT_NO_THROW(import_hf(work + "/hf", work + "/same", 7));  // the same model: same recipe
  const Config llama_cfg = tiny(ModelFamily::LLaMA, false);
  export_hf(write_checkpoint(work + "/l", llama_cfg, random_params(llama_cfg, 2), 1),
            work + "/hf-llama");
  msg = error_of([&] { import_hf(work + "/hf-llama", work + "/same", 8); });
  EXPECT_NE(msg.find("recipe.toml: holds a recipe for another model"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(checkpoint_dir(work + "/same", 8)));
  fs::remove_all(work);
}

TEST(ConvertHf, ExportNamesAMissingParameter) {
  const std::string work = fresh_dir("missing");
  const Config cfg = tiny(ModelFamily::GPT2, true);
  Params p = random_params(cfg, 17);
  for (size_t i = 0; i < p.names.size(); ++i)
    if (p.names[i] == "layers.1.attn.v.bias") {
      p.names.erase(p.names.begin() + static_cast<std::ptrdiff_t>(i));
      p.shapes.erase(p.shapes.begin() + static_cast<std::ptrdiff_t>(i));
      p.values.erase(p.values.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  const std::string dir = write_checkpoint(work + "/a", cfg, p, 1);
  const std::string msg = error_of([&] { export_hf(dir, work + "/hf"); });
  EXPECT_NE(msg.find("param/layers.1.attn.v.bias"), std::string::npos) << msg;
  fs::remove_all(work);
}

// Issue 45: a LLaMA export into the folder of a GPT-2 one replaced it without a word.
TEST(ConvertHf, ExportRefusesToReplaceAnExportUnlessAskedTo) {
  const std::string work = fresh_dir("replace");
  const Config gpt2 = tiny(ModelFamily::GPT2, true), llama = tiny(ModelFamily::LLaMA, true);
  const std::string a = write_checkpoint(work + "/a", gpt2, random_params(gpt2, 3), 1);
  const std::string b = write_checkpoint(work + "/b", llama, random_params(llama, 4), 1);
  fs::create_directories(work + "/empty");
  export_hf(a, work + "/empty");  // an empty directory is no export to lose
  export_hf(a, work + "/hf");
  const auto before = fs::last_write_time(work + "/hf/model.safetensors");
  const std::string msg = error_of([&] { export_hf(b, work + "/hf"); });
  EXPECT_NE(msg.find(work + "/hf: already exists (an export of a gpt2 model)"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("--overwrite"), std::string::npos) << msg;
  EXPECT_EQ(read_json(work + "/hf/config.json")["model_type"], "gpt2");
  EXPECT_EQ(fs::last_write_time(work + "/hf/model.safetensors"), before);
  // A stray file or a file in the way counts too.
  std::ofstream(work + "/other.txt") << "x";
  EXPECT_NE(error_of([&] { export_hf(b, work + "/other.txt"); }).find("(a file)"),
            std::string::npos);
  // Asked to: the weights and config are the LLaMA's, and the GPT-2's shards are gone.
  std::ofstream(work + "/hf/model-00002-of-00002.safetensors") << "stale";
  export_hf(b, work + "/hf", /*overwrite=*/true);
  EXPECT_EQ(read_json(work + "/hf/config.json")["model_type"], "llama");
  EXPECT_FALSE(fs::exists(work + "/hf/model-00002-of-00002.safetensors"));
  // llm.c's file the same way.
  export_llmc(a, work + "/gpt2.bin");
  EXPECT_NE(error_of([&] { export_llmc(a, work + "/gpt2.bin"); }).find("--overwrite"),
            std::string::npos);
  export_llmc(a, work + "/gpt2.bin", /*overwrite=*/true);
  fs::remove_all(work);
}

// ---- pentad -> llm.c ----

TEST(ConvertLlmc, HeaderAndParameterPositions) {
  const std::string work = fresh_dir("llmc");
  Config cfg = tiny(ModelFamily::GPT2, true);
  cfg.model.vocab_size = 130;  // pads to Vp = 256
  cfg = parse_recipe(recipe_to_toml(cfg), "test");
  const Params p = random_params(cfg, 19);
  const std::string out = work + "/model.bin";
  export_llmc(write_checkpoint(work + "/a", cfg, p, 1), out);
  const int64_t C = 8, L = 2, V = 130, Vp = 256, T = 16;
  std::ifstream f(out, std::ios::binary);
  std::vector<int32_t> header(256);
  f.read(reinterpret_cast<char*>(header.data()), 256 * 4);
  EXPECT_EQ(header[0], 20240326);
  EXPECT_EQ(header[1], 3);
  EXPECT_EQ(header[2], T);
  EXPECT_EQ(header[3], V);
  EXPECT_EQ(header[4], L);
  EXPECT_EQ(header[5], 2);  // heads
  EXPECT_EQ(header[6], C);
  EXPECT_EQ(header[7], Vp);
  for (int i = 8; i < 256; ++i) EXPECT_EQ(header[static_cast<size_t>(i)], 0);
  const int64_t n =
      Vp * C + T * C +
      L * (C + C + 3 * C * C + 3 * C + C * C + C + C + C + 4 * C * C + 4 * C + 4 * C * C + C) +
      2 * C;
  ASSERT_EQ(static_cast<int64_t>(fs::file_size(out)), 256 * 4 + n * 4);
  std::vector<float> w(static_cast<size_t>(n));
  f.read(reinterpret_cast<char*>(w.data()), n * 4);
  auto at = [&](int64_t i) { return w[static_cast<size_t>(i)]; };
  // Offsets of llm.c's tensors, in its order.
  const int64_t wte = 0, wpe = Vp * C, ln1w = wpe + T * C, ln1b = ln1w + L * C, qkvw = ln1b + L * C,
                qkvb = qkvw + L * 3 * C * C, attprojw = qkvb + L * 3 * C,
                attprojb = attprojw + L * C * C, ln2w = attprojb + L * C, ln2b = ln2w + L * C,
                fcw = ln2b + L * C, fcb = fcw + L * 4 * C * C, fcprojw = fcb + L * 4 * C,
                fcprojb = fcprojw + L * C * 4 * C, lnfw = fcprojb + L * C, lnfb = lnfw + C;
  EXPECT_EQ(lnfb + C, n);
  EXPECT_EQ(at(wte + 129 * C + 7), value(p, "wte.weight")[129 * 8 + 7]);
  EXPECT_EQ(at(wte + 130 * C), 0.0f);  // padding rows
  EXPECT_EQ(at(wte + 255 * C + 7), 0.0f);
  EXPECT_EQ(at(wpe + 15 * C + 1), value(p, "wpe.weight")[15 * 8 + 1]);
  EXPECT_EQ(at(ln1b + 1 * C + 4), value(p, "layers.1.norm1.bias")[4]);
  // qkvw layer 1, row C + 5 (k's output 5), column 2.
  EXPECT_EQ(at(qkvw + 1 * 3 * C * C + (C + 5) * C + 2),
            value(p, "layers.1.attn.k.weight")[5 * 8 + 2]);
  EXPECT_EQ(at(qkvb + 0 * 3 * C + 2 * C + 6), value(p, "layers.0.attn.v.bias")[6]);
  EXPECT_EQ(at(attprojw + 1 * C * C + 3 * C + 1), value(p, "layers.1.attn.o.weight")[3 * 8 + 1]);
  EXPECT_EQ(at(attprojb + 1 * C), value(p, "layers.1.attn.o.bias")[0]);
  EXPECT_EQ(at(ln2w + 7), value(p, "layers.0.norm2.weight")[7]);
  EXPECT_EQ(at(ln2b + C), value(p, "layers.1.norm2.bias")[0]);
  EXPECT_EQ(at(fcw + 1 * 4 * C * C + 31 * C + 7), value(p, "layers.1.mlp.up.weight")[31 * 8 + 7]);
  EXPECT_EQ(at(fcb + 4 * C + 31), value(p, "layers.1.mlp.up.bias")[31]);
  EXPECT_EQ(at(fcprojw + 0 * C * 4 * C + 7 * 4 * C + 30),
            value(p, "layers.0.mlp.down.weight")[7 * 32 + 30]);
  EXPECT_EQ(at(fcprojb + C + 2), value(p, "layers.1.mlp.down.bias")[2]);
  EXPECT_EQ(at(lnfw + 3), value(p, "norm_f.weight")[3]);
  EXPECT_EQ(at(lnfb + 7), value(p, "norm_f.bias")[7]);
  fs::remove_all(work);
}

TEST(ConvertLlmc, RefusesLlamaAndUntiedGpt2) {
  const std::string work = fresh_dir("llmcrefuse");
  const Config llama = tiny(ModelFamily::LLaMA, false);
  std::string msg = error_of([&] {
    export_llmc(write_checkpoint(work + "/a", llama, random_params(llama, 1), 1), work + "/m.bin");
  });
  EXPECT_NE(msg.find("GPT-2 only; this is a llama model"), std::string::npos) << msg;
  const Config untied = tiny(ModelFamily::GPT2, false);
  msg = error_of([&] {
    export_llmc(write_checkpoint(work + "/b", untied, random_params(untied, 1), 1),
                work + "/m.bin");
  });
  EXPECT_NE(msg.find("untied"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(work + "/m.bin"));
  fs::remove_all(work);
}
