// Recipes: every shipped recipe loads, overrides and family defaults work, recipe_to_toml
// round-trips bit for bit, and every kind of mistake gives a message naming the file,
// the key and what is allowed.
#include "recipe/recipe.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
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

namespace pentad {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test program for recipes the tests write; removed at exit.
fs::path temp_dir() {
  struct Dir {
    fs::path path;
    Dir() : path(fs::temp_directory_path() / ("pentad_recipe_test_" + std::to_string(getpid()))) {
      fs::create_directories(path);
    }
    ~Dir() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  };
  static const Dir dir;
  return dir.path;
}

std::string write_recipe(const std::string& name, const std::string& text) {
  fs::path path = temp_dir() / name;
  std::ofstream(path) << text;
  return path.string();
}

// Field-by-field, floats by bit pattern: "round trip" means exactly the same Config.
void expect_same(const Config& a, const Config& b) {
  auto bits = [](float f) { return std::bit_cast<uint32_t>(f); };
  EXPECT_EQ(a.model.family, b.model.family);
  EXPECT_EQ(a.model.n_layer, b.model.n_layer);
  EXPECT_EQ(a.model.d_model, b.model.d_model);
  EXPECT_EQ(a.model.n_head, b.model.n_head);
  EXPECT_EQ(a.model.n_kv_head, b.model.n_kv_head);
  EXPECT_EQ(a.model.d_ff, b.model.d_ff);
  EXPECT_EQ(a.model.vocab_size, b.model.vocab_size);
  EXPECT_EQ(a.model.max_seq_len, b.model.max_seq_len);
  EXPECT_EQ(bits(a.model.norm_eps), bits(b.model.norm_eps));
  EXPECT_EQ(bits(a.model.rope_theta), bits(b.model.rope_theta));
  EXPECT_EQ(bits(a.model.init_std), bits(b.model.init_std));
  EXPECT_EQ(a.model.tie_embeddings, b.model.tie_embeddings);
  EXPECT_EQ(a.model.recompute, b.model.recompute);
  EXPECT_EQ(a.model.moe_layers, b.model.moe_layers);
  EXPECT_EQ(a.model.n_experts, b.model.n_experts);
  EXPECT_EQ(a.model.top_k, b.model.top_k);
  EXPECT_EQ(a.model.d_ff_expert, b.model.d_ff_expert);
  EXPECT_EQ(a.model.n_shared_experts, b.model.n_shared_experts);
  EXPECT_EQ(a.model.moe.score, b.model.moe.score);
  EXPECT_EQ(a.model.moe.renormalize, b.model.moe.renormalize);
  EXPECT_EQ(bits(a.model.moe.aux_loss_coef), bits(b.model.moe.aux_loss_coef));
  EXPECT_EQ(bits(a.model.moe.seq_aux_loss_coef), bits(b.model.moe.seq_aux_loss_coef));
  EXPECT_EQ(bits(a.model.moe.z_loss_coef), bits(b.model.moe.z_loss_coef));
  EXPECT_EQ(bits(a.model.moe.bias_update_rate), bits(b.model.moe.bias_update_rate));
  EXPECT_EQ(bits(a.model.moe.capacity_factor), bits(b.model.moe.capacity_factor));
  EXPECT_EQ(a.parallel.ep, b.parallel.ep);
  EXPECT_EQ(a.parallel.etp, b.parallel.etp);
  EXPECT_EQ(bits(a.optim.lr), bits(b.optim.lr));
  EXPECT_EQ(bits(a.optim.min_lr_ratio), bits(b.optim.min_lr_ratio));
  EXPECT_EQ(a.optim.warmup_steps, b.optim.warmup_steps);
  EXPECT_EQ(a.optim.decay, b.optim.decay);
  EXPECT_EQ(bits(a.optim.beta1), bits(b.optim.beta1));
  EXPECT_EQ(bits(a.optim.beta2), bits(b.optim.beta2));
  EXPECT_EQ(bits(a.optim.eps), bits(b.optim.eps));
  EXPECT_EQ(bits(a.optim.weight_decay), bits(b.optim.weight_decay));
  EXPECT_EQ(bits(a.optim.grad_clip), bits(b.optim.grad_clip));
  EXPECT_EQ(a.train.steps, b.train.steps);
  EXPECT_EQ(a.train.micro_batch, b.train.micro_batch);
  EXPECT_EQ(a.train.seq_len, b.train.seq_len);
  EXPECT_EQ(a.train.grad_accum, b.train.grad_accum);
  EXPECT_EQ(a.train.seed, b.train.seed);
  EXPECT_EQ(a.train.eval_every, b.train.eval_every);
  EXPECT_EQ(a.train.eval_batches, b.train.eval_batches);
  EXPECT_EQ(a.train.log_every, b.train.log_every);
  EXPECT_EQ(a.train.threads, b.train.threads);
  EXPECT_EQ(a.train.out_dir, b.train.out_dir);
  EXPECT_EQ(a.data.source, b.data.source);
  EXPECT_EQ(a.data.path, b.data.path);
  EXPECT_EQ(a.data.val_path, b.data.val_path);
  EXPECT_EQ(bits(a.data.val_fraction), bits(b.data.val_fraction));
  EXPECT_EQ(a.data.tokenizer, b.data.tokenizer);
  EXPECT_EQ(a.data.cache_dir, b.data.cache_dir);
}

std::vector<fs::path> shipped_recipes() {
  std::vector<fs::path> paths;
  for (const auto& entry : fs::directory_iterator(fs::path(PENTAD_SOURCE_DIR) / "recipes"))
    if (entry.path().extension() == ".toml") paths.push_back(entry.path());
  return paths;
}

Config load_shipped(const std::string& name, const std::vector<std::string>& overrides = {}) {
  return load_recipe(std::string(PENTAD_SOURCE_DIR) + "/recipes/" + name + ".toml", overrides);
}

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

// ---- the table of mistakes ----

struct BadRecipe {
  std::string name;  // also the file name, <name>.toml
  std::string toml;
  std::vector<std::string> overrides;
  std::vector<std::string> expect;  // substrings of the message
};

std::vector<BadRecipe> bad_recipes() {
  return {
      {"unknown_key",
       "[model]\nn_layer = 2\nn_heads = 4\n",
       {},
       {"unknown_key.toml:3:", "model.n_heads", "did you mean model.n_head?"}},
      {"key_in_wrong_section", "[train]\nlr = 1e-3\n", {}, {"train.lr", "did you mean optim.lr?"}},
      {"unknown_section",
       "[modle]\nn_layer = 2\n",
       {},
       {"unknown_section.toml", "unknown section [modle]", "did you mean [model]?"}},
      {"key_outside_section", "n_layer = 2\n", {}, {"outside any section", "model.n_layer"}},
      {"section_not_table", "model = 3\n", {}, {"[model] must be a section"}},
      {"wrong_type",
       "[model]\nn_layer = \"two\"\n",
       {},
       {"wrong_type.toml:2:", "model.n_layer must be an integer, got string \"two\""}},
      {"int_as_float",
       "[model]\nn_layer = 3.0\n",
       {},
       {"int_as_float.toml", "model.n_layer must be an integer, got float 3.0"}},
      {"bool_as_int",
       "[model]\ntie_embeddings = 1\n",
       {},
       {"model.tie_embeddings must be a boolean", "got integer 1"}},
      {"float_as_string",
       "[optim]\nlr = \"3e-4\"\n",
       {},
       {"optim.lr must be a number, got string"}},
      {"zero_layers", "[model]\nn_layer = 0\n", {}, {"model.n_layer must be >= 1, got 0"}},
      {"tiny_vocab", "[model]\nvocab_size = 1\n", {}, {"model.vocab_size must be >= 2"}},
      {"heads_not_dividing_width",
       "[model]\nd_model = 100\nn_head = 3\n",
       {},
       {"heads_not_dividing_width.toml",
        "model.d_model (100) must be divisible by model.n_head (3)"}},
      {"kv_heads_not_dividing_heads",
       "[model]\nfamily = \"llama\"\nd_model = 96\nn_head = 6\nn_kv_head = 4\n",
       {},
       {"kv_heads_not_dividing_heads.toml",
        "model.n_head (6) must be divisible by model.n_kv_head (4)"}},
      {"more_kv_heads_than_heads",
       "[model]\nfamily = \"llama\"\nn_kv_head = 8\n",
       {},
       {"model.n_kv_head (8) must be in [0, model.n_head (4)]"}},
      {"negative_kv_heads", "[model]\nn_kv_head = -1\n", {}, {"model.n_kv_head must be >= 0"}},
      {"gpt2_with_gqa",
       "[model]\nfamily = \"gpt2\"\nn_kv_head = 2\n",
       {},
       {"model.n_kv_head (2) must be 0 or model.n_head (4)",
        "GPT-2 has no grouped-query attention"}},
      {"odd_head_dim_llama",
       "[model]\nfamily = \"llama\"\nd_model = 60\nn_head = 4\n",
       {},
       {"odd_head_dim_llama.toml", "head_dim", "= 15 must be even", "RoPE"}},
      {"seq_len_too_long",
       "[train]\nseq_len = 128\n",
       {},
       {"seq_len_too_long.toml", "train.seq_len (128) must be at most model.max_seq_len (64)"}},
      {"negative_lr",
       "[optim]\nlr = -0.1\n",
       {},
       {"negative_lr.toml:2:", "optim.lr must be >= 0, got -0.1"}},
      {"eps_underflows_float",
       "[optim]\neps = 1e-50\n",
       {},
       {"optim.eps must be > 0, got 1e-50 (0 as a float)"}},
      {"lr_overflows_float",
       "[optim]\nlr = 1e300\n",
       {},
       {"optim.lr must be a finite number", "got float 1e+300"}},
      {"lr_nan", "[optim]\nlr = nan\n", {}, {"optim.lr must be a finite number"}},
      {"beta2_one", "[optim]\nbeta2 = 1.0\n", {}, {"optim.beta2 must be in [0, 1), got 1"}},
      {"negative_clip", "[optim]\ngrad_clip = -1\n", {}, {"optim.grad_clip must be >= 0"}},
      {"bad_decay",
       "[optim]\ndecay = \"cosinus\"\n",
       {},
       {"bad_decay.toml",
        "optim.decay must be one of \"cosine\" | \"linear\" | \"constant\", got \"cosinus\""}},
      {"bad_family",
       "[model]\nfamily = \"mistral\"\n",
       {},
       {"bad_family.toml", "model.family must be one of \"gpt2\" | \"llama\", got \"mistral\""}},
      {"family_not_string",
       "[model]\nfamily = 2\n",
       {},
       {"model.family must be one of", "got integer 2"}},
      {"bad_source",
       "[data]\nsource = \"web\"\n",
       {},
       {"data.source must be one of", "\"megatron\""}},
      {"megatron_without_path",
       "[data]\nsource = \"megatron\"\n",
       {},
       {"megatron_without_path.toml", "data.path is required when data.source = \"megatron\""}},
      {"llmc_without_path",
       "[data]\nsource = \"llmc\"\n",
       {},
       {"data.path is required", "\"llmc\""}},
      {"val_fraction_one",
       "[data]\nval_fraction = 1.0\n",
       {},
       {"data.val_fraction must be in [0, 1)"}},
      {"empty_recipe", "# nothing here\n\n[model]\n", {}, {"empty_recipe.toml", "sets no key"}},
      {"section_list_names_parallel",
       "[paralel]\ntp = 2\n",
       {},
       {"did you mean [parallel]?",
        "sections are [model], [moe], [optim], [train], [data], [parallel], [checkpoint]"}},
      {"zero_micro_batch", "[train]\nmicro_batch = 0\n", {}, {"train.micro_batch must be >= 1"}},
      {"negative_steps", "[train]\nsteps = -5\n", {}, {"train.steps must be >= 0, got -5"}},
      {"override_no_equals", "", {"foo"}, {"override 'foo' is malformed", "section.key=value"}},
      {"override_no_key", "", {"=3"}, {"override '=3' is malformed"}},
      {"override_empty_name", "", {"model.=2"}, {"override 'model.=2' is malformed"}},
      {"override_too_many_dots", "", {"model.a.b=2"}, {"override 'model.a.b=2' is malformed"}},
      {"override_unknown_key",
       "",
       {"model.n_layers=3"},
       {"override 'model.n_layers=3'", "unknown key model.n_layers",
        "did you mean model.n_layer?"}},
      {"override_unknown_section",
       "",
       {"modle.n_layer=3"},
       {"override 'modle.n_layer=3'", "unknown section [modle]"}},
      {"override_wrong_type",
       "",
       {"model.n_layer=abc"},
       {"override_wrong_type.toml", "override 'model.n_layer=abc'",
        "model.n_layer must be an integer, got string"}},
      {"override_out_of_range",
       "[model]\nn_layer = 2\n",
       {"model.n_layer=-2"},
       {"override 'model.n_layer=-2'", "model.n_layer must be >= 1"}},
      {"override_breaks_combination",
       "",
       {"train.seq_len=128"},
       {"override 'train.seq_len=128'",
        "train.seq_len (128) must be at most model.max_seq_len (64)"}},
      {"override_bad_toml_string",
       "",
       {"model.family=\"llama"},
       {"override 'model.family=\"llama'", "not valid TOML"}},
      {"syntax_error", "[model]\nn_layer = 2\nd_model = = 64\n", {}, {"syntax_error.toml:3:"}},
      {"unterminated_string",
       "[data]\n\nsource = \"fortunes\n",
       {},
       {"unterminated_string.toml:3:"}},
      {"duplicate_key", "[model]\nn_layer = 2\nn_layer = 3\n", {}, {"duplicate_key.toml:3:"}},
      {"bad_device",
       "[train]\ndevice = \"gpu\"\n",
       {},
       {"train.device must be one of", "\"cuda\""}},
      {"bf16_on_cpu",
       "[train]\nprecision = \"bf16\"\n",
       {},
       {"bf16_on_cpu.toml", "train.precision = \"bf16\" needs train.device = \"cuda\""}},
      {"cudnn_attention_on_cpu",
       "[train]\nattention = \"cudnn\"\n",
       {},
       {"cudnn_attention_on_cpu.toml:2:",
        "train.attention = \"cudnn\" needs train.device = \"cuda\""}},
      {"bad_attention",
       "[train]\nattention = \"flash\"\n",
       {},
       {"train.attention must be one of", "\"pentad\""}},
      {"slow_pipeline_link_on_cuda",
       "[model]\nn_layer = 4\n[train]\ndevice = \"cuda\"\n[parallel]\npp = 2\n"
       "pp_link_delay_ms = 5\n",
       {},
       {"parallel.pp_link_delay_ms = 5 with train.device = \"cuda\"",
        "set parallel.pp_link_delay_ms = 0"}},
      {"head_dim_over_cuda_limit",
       "[model]\nd_model = 528\nn_head = 2\n[train]\ndevice = \"cuda\"\n",
       {},
       {"head_dim_over_cuda_limit.toml:", "model.d_model", "model.n_head", "train.device",
        "head_dim = model.d_model / model.n_head = 528 / 2 = 264 is above 256",
        "pentad's kernel: up to 256", "raise model.n_head"}},
      {"head_dim_not_for_cudnn",
       "[model]\nd_model = 264\nn_head = 2\n[train]\ndevice = \"cuda\"\nattention = \"cudnn\"\n",
       {},
       {"train.attention", "264 / 2 = 132", "multiples of 8", "set train.attention = \"auto\""}},
      // Mixture of Experts.
      {"experts_without_layers",
       "[model]\nn_experts = 4\n",
       {},
       {"experts_without_layers.toml:2:", "model.n_experts = 4 but model.moe_layers is empty"}},
      {"layers_without_experts",
       "[model]\nmoe_layers = \"all\"\n",
       {},
       {"layers_without_experts.toml:2:", "model.n_experts = 0"}},
      {"moe_layers_malformed",
       "[model]\nn_experts = 4\nmoe_layers = \"every 2\"\n",
       {},
       {"moe_layers_malformed.toml:3:", "model.moe_layers = \"every 2\"", "is not a layer number"}},
      {"moe_layer_past_the_model",
       "[model]\nn_experts = 4\nmoe_layers = \"1,2\"\n",
       {},
       {"names layer 2, but model.n_layer = 2"}},
      {"top_k_above_experts",
       "[model]\nn_experts = 4\ntop_k = 5\nmoe_layers = \"all\"\n",
       {},
       {"top_k_above_experts.toml:3:", "model.top_k (5) must be at most model.n_experts (4)"}},
      {"capacity_below_one_over_k",
       "[model]\nn_experts = 4\ntop_k = 2\nmoe_layers = \"all\"\n[moe]\ncapacity_factor = 0.3\n",
       {},
       {"capacity_below_one_over_k.toml:6:", "moe.capacity_factor = 0.3 is below 1 / model.top_k"}},
      {"experts_not_divisible_by_ep",
       "[model]\nn_experts = 6\nmoe_layers = \"all\"\n[parallel]\nep = 4\n",
       {},
       {"experts_not_divisible_by_ep.toml:5:",
        "model.n_experts (6) must be divisible by parallel.ep (4)", "(1, 2, 3, 6)"}},
      {"expert_width_not_divisible_by_etp",
       "[model]\nn_experts = 4\nmoe_layers = \"all\"\nd_ff_expert = 30\n[parallel]\netp = 4\n",
       {},
       {"model.d_ff_expert = 30) must be divisible by parallel.etp (4)"}},
      {"shared_width_not_divisible_by_tp",
       "[model]\nn_experts = 4\nmoe_layers = \"all\"\nd_ff_expert = 30\nn_shared_experts = 1\n"
       "[parallel]\ntp = 4\nsequence_parallel = true\n",
       {},
       {"shared experts' width", "1 x 30 = 30) must be divisible by parallel.tp (4)"}},
      {"moe_tp_needs_sequence_parallel",
       "[model]\nn_experts = 4\nmoe_layers = \"all\"\n[parallel]\ntp = 2\n",
       {},
       {"parallel.tp = 2 need parallel.sequence_parallel = true"}},
      {"ep_without_experts", "[parallel]\nep = 2\n", {}, {"the model has no MoE layers"}},
      {"shared_experts_without_moe",
       "[model]\nn_shared_experts = 2\n",
       {},
       {"model.n_shared_experts is set but the model has no MoE layers"}},
      {"zero_live_units_zero",
       "[parallel]\nzero = 3\nzero_live_units = 0\n",
       {},
       {"parallel.zero_live_units", ">= 1"}},
      {"zero_live_units_without_stage_three",
       "[parallel]\nzero = 1\nzero_live_units = 1\n",
       {},
       {"parallel.zero_live_units = 1", "set parallel.zero = 3 or remove zero_live_units"}},
  };
}

TEST(Recipe, BadRecipesFailWithActionableMessages) {
  auto rows = bad_recipes();
  ASSERT_GE(rows.size(), 15u);
  for (const BadRecipe& row : rows) {
    SCOPED_TRACE(row.name);
    std::string path = write_recipe(row.name + ".toml", row.toml);
    try {
      load_recipe(path, row.overrides);
      ADD_FAILURE() << row.name << ": loaded without error";
    } catch (const Error& e) {
      std::string message = e.what();
      for (const std::string& part : row.expect)
        EXPECT_NE(message.find(part), std::string::npos)
            << "message:  " << message << "\nmissing:  " << part;
      // Values are shown as written, not as a float widened to 17 digits (-0.10000000149).
      EXPECT_EQ(message.find("0000000"), std::string::npos) << message;
    }
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
