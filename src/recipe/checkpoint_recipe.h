#pragma once
// Whether a checkpoint belongs to this run's model: the recipe a checkpoint recorded
// (Manifest::recipe_toml, written by recipe_to_toml) against this run's, key by key.
// Keys that define the model's function or its token ids must be equal for a resume or
// an init_from; every other key (steps, schedule, layout, cadence, data path) may change.
#include <string>
#include <vector>

#include "recipe/config.h"

namespace pentad {

struct RecipeChange {
  std::string key;                          // "<section>.<name>"
  std::string run_value, checkpoint_value;  // as recipe_to_toml writes them
};

struct RecipeComparison {
  std::vector<RecipeChange> model;  // refused: another model (or other token ids)
  std::vector<RecipeChange> other;  // allowed: logged
};

// Keys the checkpoint's recipe does not list (written by an older pentad) are not
// compared. The checkpoint's data.tokenizer is compared only when it names one (an
// imported checkpoint does not say which tokenizer it was trained with).
RecipeComparison compare_recipes(const Config& run, const std::string& checkpoint_recipe_toml);

// One line per change, each after a newline: "\n  model.n_layer: 3 in this recipe, 2 in
// the checkpoint".
std::string describe_changes(const std::vector<RecipeChange>& changes);

}  // namespace pentad
