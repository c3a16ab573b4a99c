#pragma once
// Recipes: TOML files (recipes/*.toml) that fill a Config. Every key is "<section>.<name>"
// for a field of config.h; the table of keys, their types, allowed values and meanings lives
// in recipe_keys.cpp. Every mistake in a recipe or an override throws pentad::Error naming the
// file, the full key and what is allowed.
#include <string>
#include <string_view>
#include <vector>

#include "recipe/config.h"

namespace pentad {

// Reads the recipe at `path`, applies `overrides` ("section.key=value", value in TOML
// syntax or a bare word taken as a string, later ones win), fills in family defaults
// (tie_embeddings: gpt2 true, llama false unless set) and validates the result. A file
// that sets no key is refused: it would train on the defaults without a word.
Config load_recipe(const std::string& path, const std::vector<std::string>& overrides = {});

// The same for recipe text already in memory; `name` stands for the file in messages.
// An empty `toml_text` gives the defaults of config.h (plus overrides).
Config parse_recipe(std::string_view toml_text, const std::string& name,
                    const std::vector<std::string>& overrides = {});

// Every key of `config` as a recipe; parse_recipe(recipe_to_toml(c)) gives back c exactly.
std::string recipe_to_toml(const Config& config);

// Every key, "<section>.<name>", in the order recipe_to_toml writes them.
std::vector<std::string> recipe_keys();

// docs/recipe-keys.md, whole: for every section of the key table a Markdown table of its
// keys (type, allowed values, default of config.h as TOML, meaning), in recipe order.
// `pentad recipe keys --markdown` prints it; a test checks the file against it.
std::string recipe_keys_markdown();

}  // namespace pentad
