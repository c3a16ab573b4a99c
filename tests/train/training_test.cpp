// End-to-end training behaviour on one rank: a batch can be memorised, the default
// recipe learns on the real corpus, runs are bitwise reproducible, and bad recipes stop
// the CLI before anything is written.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace pentad;

namespace {

const std::string kTrainingRecipes = std::string(PENTAD_SOURCE_DIR) + "/recipes/";

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("pentad-test-" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// The prepared fortunes corpus is shared by every test in this build.
std::string corpus_cache() {
  return std::string(PENTAD_SOURCE_DIR) + "/build-test-data";
}

float overfit(const std::string& recipe) {
  Config cfg = load_recipe(kTrainingRecipes + recipe, {"train.threads=2"});
  omp_set_num_threads(2);
  const int64_t b = 4, t = 32, V = cfg.model.vocab_size;
  Model model(cfg.model, b, t);
  model.params().initialize(7);
  cfg.optim.weight_decay = 0.0f;
  AdamW opt(cfg.optim, model.params());
  std::vector<int32_t> tokens(static_cast<size_t>(b * t + 1));
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<int32_t>(splitmix64(i) % static_cast<uint64_t>(V));
  std::vector<int32_t> inputs(tokens.begin(), tokens.end() - 1),
      targets(tokens.begin() + 1, tokens.end());
  float loss = 0.0f;
  for (int step = 0; step < 300; ++step) {
    model.params().zero_grads();
    loss = model.forward(inputs.data(), targets.data(), 1.0f / static_cast<float>(b * t));
    model.backward();
    const GradSquares sq = grad_sum_squares(model.params());
    clip_gradients(model.params(), std::sqrt(sq.sharded + sq.replicated), 1.0f);
    opt.step(model.params(), 3e-3f);
  }
  return loss;
}

}  // namespace

TEST(Training, Gpt2OverfitsOneBatch) {
  EXPECT_LT(overfit("gpt-tiny.toml"), 0.05f);
}
TEST(Training, LlamaOverfitsOneBatch) {
  EXPECT_LT(overfit("llama-tiny.toml"), 0.05f);
}

TEST(Training, SameSeedIsBitwiseIdenticalAndSeedMatters) {
  auto run = [](const std::string& seed, std::vector<float>& losses) {
    Config cfg = load_recipe(kTrainingRecipes + "llama-tiny.toml",
                             {"data.source=random", "train.steps=6", "train.threads=2",
                              "train.grad_accum=2", "train.seed=" + seed});
    Trainer trainer(cfg);
    for (int64_t s = 0; s < cfg.train.steps; ++s) losses.push_back(trainer.train_step(s).loss);
    const ParamStore& p = trainer.model().params();
    return std::vector<float>(p.all_params().f32(), p.all_params().f32() + p.numel());
  };
  std::vector<float> l1, l2, l3;
  std::vector<float> w1 = run("5", l1), w2 = run("5", l2), w3 = run("6", l3);
  ASSERT_EQ(l1.size(), 6u);
  EXPECT_EQ(0, std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(w1.data(), w2.data(), w1.size() * sizeof(float)));
  EXPECT_NE(0, std::memcmp(w1.data(), w3.data(), w1.size() * sizeof(float)));
}

TEST(Training, DefaultRecipeLearnsTheCorpusUnderMpirun) {
  fs::path out = scratch("default");
  std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 1 " +
                    std::string(PENTAD_BINARY) + " train " + kTrainingRecipes + "gpt-tiny.toml" +
                    " --set train.out_dir=" + out.string() +
                    " --set data.cache_dir=" + corpus_cache() + " --set train.threads=2 > " +
                    (out / "log.txt").string() + " 2>&1";
  ASSERT_EQ(0, std::system(cmd.c_str())) << std::ifstream(out / "log.txt").rdbuf();
  std::ifstream metrics(out / "metrics.jsonl");
  std::vector<float> losses, evals;
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) losses.push_back(j["loss"].get<float>());
    if (j.contains("eval_loss")) evals.push_back(j["eval_loss"].get<float>());
  }
  ASSERT_GE(losses.size(), 20u);
  ASSERT_FALSE(evals.empty());
  const float first = losses.front();
  float last = 0.0f;
  for (size_t i = losses.size() - 5; i < losses.size(); ++i) last += losses[i] / 5.0f;
  EXPECT_NEAR(first, std::log(512.0f), 0.5f);  // uniform over the vocabulary at the start
  EXPECT_LT(last, first - 1.0f);
  EXPECT_LT(evals.back(), first - 1.0f);
  EXPECT_TRUE(fs::exists(out / "recipe.toml"));
}

TEST(Training, BadRecipeStopsTheCliAndWritesNothing) {
  fs::path dir = scratch("bad");
  fs::path recipe = dir / "bad.toml";
  std::ofstream(recipe) << "[model]\nn_layers = 2\n[train]\nout_dir = \"" << (dir / "out").string()
                        << "\"\n";
  std::string cmd = std::string(PENTAD_BINARY) + " train " + recipe.string() + " > " +
                    (dir / "log.txt").string() + " 2>&1";
  int status = std::system(cmd.c_str());
  std::stringstream log;
  log << std::ifstream(dir / "log.txt").rdbuf();
  EXPECT_NE(0, status);
  EXPECT_NE(log.str().find("bad.toml"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("model.n_layers"), std::string::npos) << log.str();
  EXPECT_FALSE(fs::exists(dir / "out"));
}

// Layouts that cannot work are refused before any rank starts, naming what to change.
TEST(Layouts, RefusedWithTheDegreeToChange) {
  struct Row {
    std::vector<std::string> overrides;
    int world;
    std::vector<std::string> expect;
  };
  const std::vector<Row> rows = {
      {{"parallel.tp=2"}, 3, {"parallel.tp (2)", "3 ranks"}},
      {{"parallel.tp=2", "parallel.dp=3"}, 4, {"dp", "4"}},
      {{"parallel.tp=8"}, 8, {"tp 8", "model.n_head", "change tp"}},
      {{"parallel.tp=3"}, 3, {"tp", "3"}},
      {{"parallel.tp=2", "parallel.sequence_parallel=true", "train.micro_batch=1",
        "train.seq_len=3", "model.max_seq_len=64"},
       2,
       {"tp", "sequence"}},
  };
  for (const Row& row : rows) {
    Config cfg = load_recipe(kTrainingRecipes + "gpt-tiny.toml", row.overrides);
    try {
      mesh_config(cfg, row.world);
      ADD_FAILURE() << "accepted " << ::testing::PrintToString(row.overrides) << " on " << row.world
                    << " ranks";
    } catch (const Error& e) {
      for (const std::string& want : row.expect)
        EXPECT_NE(std::string(e.what()).find(want), std::string::npos)
            << "message \"" << e.what() << "\" lacks \"" << want << "\"";
    }
  }
}

TEST(Layouts, ContextParallelRecipesAreChecked) {
  EXPECT_NO_THROW(load_recipe(kTrainingRecipes + "gpt-tiny.toml", {"parallel.cp=2"}));
  try {
    load_recipe(kTrainingRecipes + "gpt-tiny.toml", {"parallel.cp=4", "train.seq_len=36"});
    ADD_FAILURE() << "a zig-zag ring over a sequence it does not split accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 x parallel.cp = 8"), std::string::npos) << e.what();
  }
}
