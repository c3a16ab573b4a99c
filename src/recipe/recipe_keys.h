#pragma once
// The recipe key table (recipe.cpp's parser reads it): one row per field of config.h, with
// the values it allows. Its order is the order recipe_to_toml writes; rules that involve
// two keys are checked in recipe_checks.cpp (check_combinations). For recipe.cpp (and its
// tests) only; docs/recipe-keys.md is generated from it (recipe_keys_markdown in recipe.h).
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "recipe/config.h"

namespace pentad::recipe {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

using Field = std::variant<int64_t*, uint64_t*, float*, bool*, std::string*, ModelFamily*,
                           MoeScore*, Recompute*>;

// Allowed values: a numeric interval (ends open or closed) or a list of words.
struct Rule {
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
  std::vector<std::string_view> choices;

  bool allows(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
  bool allows(std::string_view word) const {
    return choices.empty() || std::find(choices.begin(), choices.end(), word) != choices.end();
  }
  std::string text() const {
    if (!choices.empty()) {
      std::string words;
      for (auto c : choices) words += fmt::format("{}\"{}\"", words.empty() ? "" : " | ", c);
      return "one of " + words;
    }
    if (hi == kInf) return fmt::format("{} {}", lo_open ? ">" : ">=", lo);
    return fmt::format("in {}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
  }
};

struct Key {
  std::string_view section;
  std::string_view name;
  Field (*field)(Config&);
  Rule rule;
  std::string_view meaning;  // one line for docs/recipe-keys.md (recipe_keys_markdown)

  std::string full() const { return fmt::format("{}.{}", section, name); }
};

// Every key, in recipe order.
const std::vector<Key>& key_table();
// The sections of the key table, in its order.
const std::vector<std::string_view>& sections();

// A string as a TOML basic string, quotes and escapes included.
std::string quote(std::string_view s);
// A float as TOML: the shortest text that reads back as the same float, always with a
// point or an exponent.
std::string format_float(float v);

}  // namespace pentad::recipe
