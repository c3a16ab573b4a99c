// Which recipe changes a checkpoint refuses: keys that define the model or its token ids
// (each named with both values), against keys that may change between runs (logged).
#include "recipe/checkpoint_recipe.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "recipe/recipe.h"

namespace pentad {
namespace {

std::vector<std::string> keys_of(const std::vector<RecipeChange>& changes) {
  std::vector<std::string> keys;
  for (const RecipeChange& c : changes) keys.push_back(c.key);
  return keys;
}

// The recipe a checkpoint of a run with these overrides records.
std::string saved(const std::vector<std::string>& overrides) {
  return recipe_to_toml(parse_recipe("", "saved", overrides));
}

Config run(const std::vector<std::string>& overrides) {
  return parse_recipe("", "run", overrides);
}

TEST(CheckpointRecipe, TheSameRecipeChangesNothing) {
  const RecipeComparison c =
      compare_recipes(run({"model.family=llama"}), saved({"model.family=llama"}));
  EXPECT_TRUE(c.model.empty());
  EXPECT_TRUE(c.other.empty());
}

TEST(CheckpointRecipe, ModelKeysAreRefusedWithBothValues) {
  const RecipeComparison c = compare_recipes(run({"model.n_layer=3", "model.rope_theta=500000.0",
                                                  "model.norm_eps=1e-6", "model.max_seq_len=128"}),
                                             saved({}));
  EXPECT_EQ(keys_of(c.model), (std::vector<std::string>{"model.max_seq_len", "model.n_layer",
                                                        "model.norm_eps", "model.rope_theta"}));
  const std::string text = describe_changes(c.model);
  EXPECT_NE(text.find("\n  model.n_layer: 3 in this recipe, 2 in the checkpoint"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("model.rope_theta: 500000.0 in this recipe, 10000.0 in the checkpoint"),
            std::string::npos)
      << text;
}

TEST(CheckpointRecipe, TyingAnUntiedCheckpointIsRefused) {
  const RecipeComparison c = compare_recipes(
      run({"model.family=llama", "model.tie_embeddings=true"}), saved({"model.family=llama"}));
  EXPECT_EQ(keys_of(c.model), (std::vector<std::string>{"model.tie_embeddings"}));
  // Another family changes its default tying too.
  EXPECT_EQ(keys_of(compare_recipes(run({"model.family=llama"}), saved({})).model),
            (std::vector<std::string>{"model.family", "model.tie_embeddings"}));
}

TEST(CheckpointRecipe, RunKeysMayChangeAndAreListed) {
  const RecipeComparison c = compare_recipes(
      run({"train.steps=500", "optim.lr=1e-3", "parallel.tp=2", "train.save_every=5", "data.path=x",
           "model.recompute=true", "model.init_std=0.01", "train.resume=latest"}),
      saved({}));
  EXPECT_TRUE(c.model.empty()) << describe_changes(c.model);
  EXPECT_EQ(keys_of(c.other),
            (std::vector<std::string>{"data.path", "model.init_std", "model.recompute", "optim.lr",
                                      "parallel.tp", "train.save_every", "train.steps"}));
}

TEST(CheckpointRecipe, SpellingsOfTheSameModelAreEqual) {
  // n_kv_head = 0 means as many as n_head.
  EXPECT_TRUE(compare_recipes(run({"model.family=llama", "model.n_kv_head=4"}),
                              saved({"model.family=llama"}))
                  .model.empty());
  EXPECT_EQ(keys_of(compare_recipes(run({"model.family=llama", "model.n_kv_head=2"}),
                                    saved({"model.family=llama"}))
                        .model),
            (std::vector<std::string>{"model.n_kv_head"}));
  // d_ff = 0 means the family's rule: 4C for GPT-2, 2/3 * 4C rounded up to 256 for LLaMA.
  EXPECT_TRUE(compare_recipes(run({"model.d_ff=256"}), saved({})).model.empty());
  EXPECT_TRUE(
      compare_recipes(run({"model.family=llama"}), saved({"model.family=llama", "model.d_ff=256"}))
          .model.empty());
  EXPECT_EQ(keys_of(compare_recipes(run({"model.d_ff=128"}), saved({})).model),
            (std::vector<std::string>{"model.d_ff"}));
}

TEST(CheckpointRecipe, TokenizerIsComparedWhereTheCheckpointNamesOne) {
  // An imported checkpoint names none: fine-tuning it with a tokenizer file is allowed.
  EXPECT_TRUE(compare_recipes(run({"data.tokenizer=tok.json"}), saved({})).model.empty());
  EXPECT_EQ(keys_of(compare_recipes(run({"data.tokenizer=other.json"}),
                                    saved({"data.tokenizer=tok.json"}))
                        .model),
            (std::vector<std::string>{"data.tokenizer"}));
}

TEST(CheckpointRecipe, KeysAnOlderRecipeLacksAreNotCompared) {
  std::string old = saved({});
  const size_t at = old.find("rope_theta = ");
  old.erase(at, old.find('\n', at) + 1 - at);
  EXPECT_TRUE(compare_recipes(run({"model.rope_theta=500000.0"}), old).model.empty());
}

// A checkpoint from before MoE (no [moe], no model.n_experts) holds a dense model.
TEST(CheckpointRecipe, ACheckpointFromBeforeMoeIsDense) {
  std::string old = saved({});
  for (const char* key : {"moe_layers = ", "n_experts = "}) {
    const size_t at = old.find(key);
    old.erase(at, old.find('\n', at) + 1 - at);
  }
  const std::vector<std::string> keys =
      keys_of(compare_recipes(run({"model.moe_layers=all", "model.n_experts=4"}), old).model);
  EXPECT_NE(std::find(keys.begin(), keys.end(), "model.moe_layers"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "model.n_experts"), keys.end());
  EXPECT_TRUE(compare_recipes(run({}), old).model.empty());
}

}  // namespace
}  // namespace pentad
