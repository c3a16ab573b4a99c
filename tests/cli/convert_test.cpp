// `pentad ckpt convert`, the export: pentad -> Hugging Face (the names, layouts and
// config.json transformers expects, and what is refused), pentad -> llm.c. The round trips
// and the import are in convert_import_test.cpp.
#include "cli/convert.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "convert_test_util.h"
#include "model/model.h"
#include "recipe/recipe.h"

namespace fs = std::filesystem;
using namespace pentad;
using namespace pentad::ckpt;
using namespace pentad::convert_test_util;

// ---- pentad -> Hugging Face ----

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
