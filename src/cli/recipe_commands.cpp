// `pentad recipe keys`: the recipe key table (recipe/recipe_keys.cpp), as a list or as
// docs/recipe-keys.md.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/command.h"
#include "recipe/recipe.h"

namespace pentad::cli {

void add_recipe_commands(Commands& commands) {
  CLI::App* recipe = commands.app().add_subcommand("recipe", "Recipe tools");
  recipe->require_subcommand(1);
  bool& markdown = commands.keep<bool>();
  CLI::App* keys = recipe->add_subcommand(
      "keys", "List every recipe key with its type, allowed values, default and meaning");
  keys->add_flag("--markdown", markdown,
                 "As docs/recipe-keys.md (a test checks that file against this output)");
  commands.add(keys, [&markdown](const Job& job) {
    if (job.rank != 0) return 0;
    if (markdown)
      std::fputs(recipe_keys_markdown().c_str(), stdout);
    else
      for (const std::string& key : recipe_keys()) std::puts(key.c_str());
    return 0;
  });
}

}  // namespace pentad::cli
