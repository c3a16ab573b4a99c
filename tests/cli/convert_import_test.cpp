// `pentad ckpt convert`, Hugging Face -> pentad: every family round-trips bitwise through
// an export and an import, and the import takes files from elsewhere (other names, buffers,
// shards, Mixtral's defaults) and refuses what it cannot represent.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "cli/convert.h"
#include "convert_test_util.h"
#include "model/model.h"
#include "recipe/recipe.h"

namespace fs = std::filesystem;
using namespace pentad;
using namespace pentad::ckpt;
using namespace pentad::convert_test_util;

namespace {

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

// ---- Hugging Face -> pentad ----

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
