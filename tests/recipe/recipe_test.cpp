// Recipes: every shipped recipe loads, overrides and family defaults work, recipe_to_toml
// round-trips bit for bit, and the key table matches its reference. The mistakes a recipe
// can make, each with its message, are in recipe_mistakes_test.cpp.
#include "recipe/recipe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "model/model.h"
#include "model/moe.h"
#include "recipe/recipe_keys.h"
#include "recipe_test_util.h"

namespace pentad {
namespace {

namespace fs = std::filesystem;
using namespace recipe_test_util;

TEST(Recipe, EveryShippedRecipeLoadsAndRoundTrips) {
  auto paths = shipped_recipes();
  ASSERT_GE(paths.size(), 5u);
  for (const auto& path : paths) {
    SCOPED_TRACE(path.string());
    std::string text;
    {
      std::ifstream in(path);
      std::getline(in, text);
    }
    EXPECT_TRUE(text.starts_with("# ")) << "a recipe starts with a comment saying what it is";
    Config c = load_recipe(path.string(), {});
    EXPECT_EQ(c.recipe_path, path.string());
    Config again =
        load_recipe(write_recipe("rt_" + path.filename().string(), recipe_to_toml(c)), {});
    expect_same(c, again);
  }
}

TEST(Recipe, ShippedShapes) {
  Config tiny = load_shipped("gpt-tiny");
  EXPECT_EQ(tiny.model.family, ModelFamily::GPT2);
  EXPECT_EQ(tiny.model.n_layer, 2);
  EXPECT_EQ(tiny.model.d_model, 64);
  EXPECT_EQ(tiny.train.micro_batch, 8);
  EXPECT_EQ(tiny.train.steps, 200);
  EXPECT_EQ(tiny.optim.lr, 3e-3f);
  EXPECT_TRUE(tiny.model.tie_embeddings);

  Config small = load_shipped("gpt2-124m");
  EXPECT_EQ(small.model.n_layer, 12);
  EXPECT_EQ(small.model.d_model, 768);
  EXPECT_EQ(small.model.vocab_size, 50257);
  EXPECT_EQ(small.train.steps, 19073);
  EXPECT_EQ(small.train.micro_batch * small.train.seq_len * small.train.grad_accum, 32768);
  EXPECT_EQ(small.optim.warmup_steps, 700);
  EXPECT_EQ(small.data.source, "llmc");

  Config medium = load_shipped("gpt2-350m");
  EXPECT_EQ(medium.model.n_layer, 24);
  EXPECT_EQ(medium.model.head_dim(), 64);

  Config llama = load_shipped("llama-tiny");
  EXPECT_EQ(llama.model.family, ModelFamily::LLaMA);
  EXPECT_EQ(llama.model.kv_heads(), 2);
  EXPECT_FALSE(llama.model.tie_embeddings);

  Config big = load_shipped("llama-1b");
  EXPECT_EQ(big.model.n_layer, 16);
  EXPECT_EQ(big.model.kv_heads(), 8);
  EXPECT_EQ(big.model.d_ff, 8192);
  EXPECT_EQ(big.model.rope_theta, 500000.0f);
  EXPECT_TRUE(big.model.tie_embeddings);
  EXPECT_TRUE(big.model.recompute.automatic);

  Config mixtral = load_shipped("mixtral-tiny");
  EXPECT_EQ(mixtral.model.family, ModelFamily::LLaMA);
  EXPECT_EQ(moe_layer_indices(mixtral.model), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(mixtral.model.n_experts, 8);
  EXPECT_EQ(mixtral.model.top_k, 2);
  EXPECT_EQ(mixtral.model.moe.score, MoeScore::Softmax);
  EXPECT_TRUE(mixtral.model.moe.renormalize);
  EXPECT_EQ(mixtral.model.moe.aux_loss_coef, 0.01f);

  Config fine = load_shipped("moe-fine-tiny");
  EXPECT_EQ(moe_layer_indices(fine.model), (std::vector<int64_t>{1, 2}));  // layer 0 dense
  EXPECT_EQ(fine.model.n_experts, 16);
  EXPECT_EQ(fine.model.top_k, 4);
  EXPECT_EQ(fine.model.n_shared_experts, 1);
  EXPECT_EQ(fine.model.moe.score, MoeScore::Sigmoid);
  EXPECT_EQ(fine.model.moe.aux_loss_coef, 0.0f);
  EXPECT_GT(fine.model.moe.bias_update_rate, 0.0f);

  Config m8x7b = load_shipped("mixtral-8x7b");
  EXPECT_EQ(m8x7b.model.n_layer, 32);
  EXPECT_EQ(m8x7b.model.d_model, 4096);
  EXPECT_EQ(m8x7b.model.kv_heads(), 8);
  EXPECT_EQ(expert_ffn_dim(m8x7b.model), 14336);
  EXPECT_EQ(m8x7b.model.n_experts, 8);
  EXPECT_EQ(m8x7b.model.rope_theta, 1e6f);

  Config qwen = load_shipped("qwen2-57b-a14b");
  EXPECT_EQ(qwen.model.n_layer, 28);
  EXPECT_EQ(qwen.model.d_model, 3584);
  EXPECT_EQ(qwen.model.kv_heads(), 4);
  EXPECT_EQ(qwen.model.n_experts, 64);
  EXPECT_EQ(qwen.model.top_k, 8);
  EXPECT_EQ(qwen.model.n_shared_experts * expert_ffn_dim(qwen.model), 20480);
  EXPECT_EQ(qwen.model.vocab_size, 151936);
  EXPECT_FALSE(qwen.model.moe.renormalize);
}

TEST(Recipe, MoeLayerPatterns) {
  auto layers = [](const std::string& pattern, int64_t n_layer) {
    ModelConfig m;
    m.n_layer = n_layer;
    m.n_experts = 4;
    m.moe_layers = pattern;
    return moe_layer_indices(m);
  };
  using L = std::vector<int64_t>;
  EXPECT_EQ(layers("all", 3), (L{0, 1, 2}));
  EXPECT_EQ(layers("every:2", 5), (L{1, 3}));
  EXPECT_EQ(layers("every:1", 2), (L{0, 1}));
  EXPECT_EQ(layers("from:1", 4), (L{1, 2, 3}));
  EXPECT_EQ(layers("from:0", 2), (L{0, 1}));
  EXPECT_EQ(layers("3, 1", 4), (L{1, 3}));
  EXPECT_EQ(layers("", 4), L{});
  for (const char* bad : {"al", "every:0", "every:", "from:-1", "1,,2", "1;2", "x", "0,2"})
    EXPECT_THROW(layers(bad, 2), Error) << bad;
  ModelConfig m;
  m.n_layer = 2;
  m.moe_layers = "all";
  EXPECT_TRUE(moe_layer_indices(m).empty()) << "n_experts = 0: a dense model";
  m.n_experts = 2;
  EXPECT_TRUE(is_moe_layer(m, 1));
  m.family = ModelFamily::LLaMA;
  m.d_model = 64;
  EXPECT_EQ(expert_ffn_dim(m), ffn_dim(m));
  m.d_ff_expert = 48;
  EXPECT_EQ(expert_ffn_dim(m), 48);
}

// Expert parallelism on CUDA (fp32) is a layout like any other: ep and etp are accepted.
TEST(Recipe, ExpertParallelOnCudaLoads) {
  const std::string path = write_recipe(
      "expert_parallel_on_cuda.toml",
      "[model]\nn_experts = 4\nmoe_layers = \"all\"\nd_ff_expert = 32\n[train]\ndevice = "
      "\"cuda\"\n[parallel]\nep = 2\netp = 2\n");
  const Config c = load_recipe(path, {});
  EXPECT_EQ(c.parallel.ep, 2);
  EXPECT_EQ(c.parallel.etp, 2);
  EXPECT_EQ(c.train.device, "cuda");
}

// ZeRO-3 with its parameter shares on NVMe (parallel.offload_params, the default) is built on
// CUDA too (optim/adamw.h: the shares come up from the file through page-locked staging):
// the recipe loads.
TEST(Recipe, Zero3NvmeParameterSharesOnCudaLoad) {
  const std::string path =
      write_recipe("zero3_nvme_params_on_cuda.toml",
                   "[train]\ndevice = \"cuda\"\n[parallel]\nzero = 3\noffload = \"nvme\"\n"
                   "offload_path = \"/tmp\"\n");
  const Config c = load_recipe(path, {});
  EXPECT_EQ(c.parallel.zero, 3);
  EXPECT_TRUE(c.parallel.offload_params);
  EXPECT_EQ(c.train.device, "cuda");
}

// MoE on CUDA in bf16 loads with its experts on one rank and with them split over ep, etp
// or both: the exchange moves bf16 rows (parallel/ep).
TEST(Recipe, MoeBf16OnCudaLoadsWithExpertParallelism) {
  const std::string path = write_recipe(
      "moe_bf16_on_cuda.toml",
      "[model]\nn_experts = 4\nmoe_layers = \"all\"\nd_ff_expert = 32\n[train]\ndevice = "
      "\"cuda\"\nprecision = \"bf16\"\n");
  EXPECT_EQ(load_recipe(path, {}).train.precision, "bf16");
  const Config ep = load_recipe(path, {"parallel.ep=2"});
  EXPECT_EQ(ep.parallel.ep, 2);
  EXPECT_EQ(ep.train.precision, "bf16");
  const Config etp = load_recipe(path, {"parallel.etp=2"});
  EXPECT_EQ(etp.parallel.etp, 2);
  const Config both = load_recipe(path, {"parallel.ep=2", "parallel.etp=2"});
  EXPECT_EQ(both.parallel.ep * both.parallel.etp, 4);
}

// Heads up to 256 wide load on CUDA (the 530B and 1T GPT configurations' are 160): pentad's
// attention kernel takes any, cuDNN's multiples of 8; 264 is refused (above).
TEST(Recipe, WideHeadsOnCudaLoad) {
  const std::string path =
      write_recipe("wide_heads_on_cuda.toml", "[model]\nn_head = 2\n[train]\ndevice = \"cuda\"\n");
  for (const char* width : {"320", "512", "264"}) {  // head_dim 160, 256, 132
    const Config c = load_recipe(path, {std::string("model.d_model=") + width});
    EXPECT_EQ(c.model.head_dim(), std::stoi(width) / 2);
  }
  for (const char* attention : {"cudnn", "pentad"})
    EXPECT_EQ(load_recipe(path, {"model.d_model=320", std::string("train.attention=") + attention})
                  .model.head_dim(),
              160);
}

TEST(Recipe, Overrides) {
  Config c = load_shipped("gpt-tiny", {"train.steps=7",                   // integer
                                       "optim.lr=1e-3",                   // float
                                       "optim.weight_decay=0",            // integer for a float
                                       "data.tokenizer=\"t.json\"",       // TOML string
                                       "train.out_dir=runs/bare",         // bare word
                                       "model.recompute=true",            // boolean
                                       " train.eval_every = 5 ",          // spaces around
                                       "train.seed=1", "train.seed=2"});  // later wins
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.optim.lr, 1e-3f);
  EXPECT_EQ(c.optim.weight_decay, 0.0f);
  EXPECT_EQ(c.data.tokenizer, "t.json");
  EXPECT_EQ(c.train.out_dir, "runs/bare");
  EXPECT_TRUE(c.model.recompute);
  EXPECT_EQ(c.train.eval_every, 5);
  EXPECT_EQ(c.train.seed, 2u);
  // Keys the recipe does not mention can be added; a TOML-quoted family equals a bare one.
  Config quoted = load_shipped("gpt-tiny", {"model.family=\"llama\"", "model.d_ff=96"});
  Config bare = load_shipped("gpt-tiny", {"model.family=llama", "model.d_ff=96"});
  EXPECT_EQ(quoted.model.family, ModelFamily::LLaMA);
  EXPECT_EQ(bare.model.d_ff, 96);
  expect_same(quoted, bare);
  // An override can repair what the file gets wrong: checks run after overrides.
  std::string path = write_recipe("repair.toml", "[train]\nseq_len = 128\n");
  EXPECT_EQ(load_recipe(path, {"model.max_seq_len=128"}).train.seq_len, 128);
}

// model.recompute: a boolean, or "auto" (decided from the memory plan before the model is
// built, resolve_recompute); written back as it was said.
TEST(Recipe, RecomputeIsTrueFalseOrAuto) {
  const Config automatic = load_shipped("gpt-tiny", {"model.recompute=auto"});
  EXPECT_TRUE(automatic.model.recompute.automatic);
  EXPECT_FALSE(automatic.model.recompute);  // off until decided
  EXPECT_NE(recipe_to_toml(automatic).find("recompute = \"auto\""), std::string::npos);
  const Config on = load_shipped("gpt-tiny", {"model.recompute=\"auto\"", "model.recompute=true"});
  EXPECT_TRUE(on.model.recompute);
  EXPECT_FALSE(on.model.recompute.automatic);
  try {
    load_shipped("gpt-tiny", {"model.recompute=sometimes"});
    ADD_FAILURE() << "model.recompute = \"sometimes\" loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.recompute must be true, false or \"auto\""),
              std::string::npos)
        << e.what();
  }
}

TEST(Recipe, FamilyDefaults) {
  EXPECT_TRUE(parse_recipe("", "defaults").model.tie_embeddings);
  EXPECT_FALSE(parse_recipe("[model]\nfamily = \"llama\"\n", "x").model.tie_embeddings);
  EXPECT_TRUE(parse_recipe("[model]\nfamily = \"llama\"\ntie_embeddings = true\n", "x")
                  .model.tie_embeddings);
  EXPECT_FALSE(parse_recipe("[model]\ntie_embeddings = false\n", "x").model.tie_embeddings);
  // The default follows the family however it was set.
  EXPECT_FALSE(load_shipped("gpt-tiny", {"model.family=llama"}).model.tie_embeddings);
  // llama-tiny says tie_embeddings = false itself, so a family override keeps it.
  EXPECT_FALSE(
      load_shipped("llama-tiny", {"model.family=gpt2", "model.n_kv_head=0"}).model.tie_embeddings);
  // Defaults of an empty recipe are config.h's.
  Config defaults;
  defaults.recipe_path = "defaults";
  expect_same(parse_recipe("", "defaults"), defaults);
}

TEST(Recipe, RoundTripIsExact) {
  Config c;
  c.model.family = ModelFamily::LLaMA;
  c.model.n_layer = 3;
  c.model.d_model = 96;
  c.model.n_head = 6;
  c.model.n_kv_head = 2;
  c.model.d_ff = 257;
  c.model.norm_eps = std::nextafter(1e-6f, 1.0f);  // floats with no short decimal form
  c.model.rope_theta = 123456.7f;
  c.model.init_std = 1.0f / 3.0f;
  c.model.tie_embeddings = true;  // not llama's default: must be written
  c.optim.lr = std::nextafter(6e-4f, 0.0f);
  c.optim.min_lr_ratio = 0.0f;
  c.optim.beta2 = 0.999f;
  c.optim.eps = 1e-8f;
  c.optim.weight_decay = 1.0f;  // must be written as 1.0 or read back as an integer
  c.optim.decay = "linear";
  c.train.seed = 9007199254740993ull;  // not representable as a double
  c.train.out_dir = "runs/\"quoted\" \\ back\tslash\n";
  c.data.source = "tokens";
  c.data.path = "/data/é.tok";
  c.data.val_fraction = 0.1f;
  std::string text = recipe_to_toml(c);
  for (const std::string& key : recipe_keys())
    EXPECT_NE(text.find(key.substr(key.find('.') + 1) + " = "), std::string::npos) << key;
  Config back = load_recipe(write_recipe("roundtrip.toml", text), {});
  expect_same(c, back);
  EXPECT_EQ(recipe_to_toml(back), text);
}

TEST(Recipe, MissingFile) {
  try {
    load_recipe("/nonexistent/recipe.toml", {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/recipe.toml"), std::string::npos);
  }
}

// docs/recipe-keys.md is generated from the key table; a key added, renamed, re-ruled or
// re-defaulted without regenerating it fails here.
TEST(RecipeKeys, ReferenceFileIsUpToDate) {
  const fs::path path = fs::path(PENTAD_SOURCE_DIR) / "docs" / "recipe-keys.md";
  const std::string regenerate =
      "docs/recipe-keys.md is out of date with the key table (src/recipe/recipe_keys.cpp): "
      "regenerate with `build/pentad recipe keys --markdown > docs/recipe-keys.md`";
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in) << "cannot read " << path.string() << "; " << regenerate;
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), recipe_keys_markdown()) << regenerate;
}

TEST(RecipeKeys, EveryKeyHasAMeaning) {
  for (const recipe::Key& k : recipe::key_table()) {
    EXPECT_FALSE(k.meaning.empty()) << k.full() << " has no meaning";
    EXPECT_EQ(k.meaning.find('\n'), std::string_view::npos) << k.full() << ": one line";
  }
  const std::string markdown = recipe_keys_markdown();
  EXPECT_TRUE(markdown.starts_with("# Recipe keys\n"));
  EXPECT_TRUE(markdown.ends_with("\n"));
  for (const std::string& key : recipe_keys())
    EXPECT_NE(markdown.find("| `" + key.substr(key.find('.') + 1) + "` |"), std::string::npos)
        << key;
}

}  // namespace
}  // namespace pentad
