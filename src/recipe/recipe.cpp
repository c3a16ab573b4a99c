#include "recipe/recipe.h"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>
#include <variant>

#include "core/check.h"
#include "recipe/recipe_checks.h"
#include "recipe/recipe_keys.h"

namespace pentad {
namespace {

using namespace recipe;  // the key table: Key, Field, Rule, key_table(), sections()

// ---- lookup and "did you mean" ----

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

bool is_section(std::string_view s) {
  return std::find(sections().begin(), sections().end(), s) != sections().end();
}

const Key* find_key(std::string_view section, std::string_view name) {
  for (const Key& k : key_table())
    if (k.section == section && k.name == name) return &k;
  return nullptr;
}

std::string section_list() {
  std::string list;
  for (auto s : sections()) list += fmt::format("{}[{}]", list.empty() ? "" : ", ", s);
  return list;
}

std::string unknown_section(std::string_view section) {
  std::string_view best;
  size_t best_distance = 3;  // suggest only near misses
  for (auto s : sections()) {
    size_t d = edit_distance(section, s);
    if (d < best_distance) best = s, best_distance = d;
  }
  std::string hint = best.empty() ? "" : fmt::format(" (did you mean [{}]?)", best);
  return fmt::format("unknown section [{}]{}; sections are {}", section, hint, section_list());
}

// A key of the same name in another section ("[train] lr") beats a near spelling.
std::string unknown_key(std::string_view section, std::string_view name) {
  const Key* best = nullptr;
  size_t best_score = std::max<size_t>(3, (name.size() + 2) / 3 + 1);  // score must be below
  for (const Key& k : key_table()) {
    size_t score = edit_distance(name, k.name) + (k.section == section ? 0 : 2);
    if (k.name == name) score = 0;
    if (score < best_score) best = &k, best_score = score;
  }
  if (best) return fmt::format("unknown key {}.{} (did you mean {}?)", section, name, best->full());
  std::string known;
  for (const Key& k : key_table())
    if (k.section == section) known += fmt::format("{}{}", known.empty() ? "" : ", ", k.name);
  return fmt::format("unknown key {}.{}; keys of [{}] are {}", section, name, section, known);
}

// ---- values ----

std::string_view family_name(ModelFamily f) {
  return f == ModelFamily::GPT2 ? "gpt2" : "llama";
}

std::string_view type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "string";
    case toml::node_type::integer:
      return "integer";
    case toml::node_type::floating_point:
      return "float";
    case toml::node_type::boolean:
      return "boolean";
    case toml::node_type::table:
      return "table";
    case toml::node_type::array:
      return "array";
    case toml::node_type::date:
      return "date";
    case toml::node_type::time:
      return "time";
    case toml::node_type::date_time:
      return "date-time";
    default:
      return "nothing";
  }
}

// The value as a user would write it (floats shortest, never as 17 digits).
std::string value_text(const toml::node& node) {
  if (auto* v = node.as_string()) return quote(v->get());
  if (auto* v = node.as_integer()) return fmt::format("{}", v->get());
  if (auto* v = node.as_boolean()) return v->get() ? "true" : "false";
  if (auto* v = node.as_floating_point()) {
    std::string s = fmt::format("{}", v->get());
    return s.find_first_not_of("-0123456789") == std::string::npos ? s + ".0" : s;
  }
  std::ostringstream text;
  node.visit([&](auto&& value) { text << value; });
  return text.str();
}

std::string describe(const toml::node& node) {
  if (node.is_table() || node.is_array()) return std::string(type_name(node));
  return fmt::format("{} {}", type_name(node), value_text(node));
}

// Shortest text that reads back as the same float through a TOML double.

// Stores `node` into the field of `key`, or fails with `origin` ("file:line:col") first.
void set_value(Config& config, const Key& key, const toml::node& node, const std::string& origin) {
  auto must_be = [&](std::string_view what) {
    fail("{}: {} must be {}, got {}", origin, key.full(), what, describe(node));
  };
  auto check_number = [&](double v) {
    if (key.rule.allows(v)) return;
    bool underflow = node.is_floating_point() && v == 0 && node.as_floating_point()->get() != 0;
    fail("{}: {} must be {}, got {}{}", origin, key.full(), key.rule.text(), value_text(node),
         underflow ? " (0 as a float)" : "");
  };
  auto check_word = [&](const std::string& word) {
    if (!key.rule.allows(word))
      fail("{}: {} must be {}, got {}", origin, key.full(), key.rule.text(), quote(word));
  };
  std::visit(
      [&](auto* dst) {
        using T = std::remove_pointer_t<decltype(dst)>;
        if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>) {
          if (!node.is_integer()) must_be("an integer");
          int64_t v = node.as_integer()->get();
          check_number(static_cast<double>(v));
          *dst = static_cast<T>(v);
        } else if constexpr (std::is_same_v<T, float>) {
          double v = 0;
          if (node.is_integer())
            v = static_cast<double>(node.as_integer()->get());
          else if (node.is_floating_point())
            v = node.as_floating_point()->get();
          else
            must_be("a number");
          if (!std::isfinite(v) || std::abs(v) > std::numeric_limits<float>::max())
            must_be("a finite number within float range");
          *dst = static_cast<float>(v);
          check_number(*dst);  // after rounding: 1e-50 is 0 as a float
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!node.is_boolean()) must_be("a boolean (true or false)");
          *dst = node.as_boolean()->get();
        } else if constexpr (std::is_same_v<T, Recompute>) {
          if (node.is_boolean()) {
            *dst = node.as_boolean()->get();
          } else if (node.is_string() && node.as_string()->get() == "auto") {
            *dst = Recompute{false, true};
          } else {
            must_be("true, false or \"auto\"");
          }
        } else {
          if (!node.is_string()) must_be(key.rule.choices.empty() ? "a string" : key.rule.text());
          const std::string& word = node.as_string()->get();
          check_word(word);
          if constexpr (std::is_same_v<T, ModelFamily>)
            *dst = word == "llama" ? ModelFamily::LLaMA : ModelFamily::GPT2;
          else if constexpr (std::is_same_v<T, MoeScore>)
            *dst = word == "sigmoid" ? MoeScore::Sigmoid : MoeScore::Softmax;
          else
            *dst = word;
        }
      },
      key.field(config));
}

std::string format_value(Field field) {
  return std::visit(
      [](auto* v) -> std::string {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, float>)
          return format_float(*v);
        else if constexpr (std::is_same_v<T, bool>)
          return *v ? "true" : "false";
        else if constexpr (std::is_same_v<T, Recompute>)
          return v->automatic ? "\"auto\"" : v->on ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string>)
          return quote(*v);
        else if constexpr (std::is_same_v<T, ModelFamily>)
          return quote(family_name(*v));
        else if constexpr (std::is_same_v<T, MoeScore>)
          return quote(moe_score_name(*v));
        else
          return fmt::format("{}", *v);
      },
      field);
}

// What a key's value is, as docs/recipe-keys.md says it.
std::string_view field_type(Field field) {
  return std::visit(
      [](auto* v) -> std::string_view {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>)
          return "integer";
        else if constexpr (std::is_same_v<T, uint64_t>)
          return "unsigned integer";
        else if constexpr (std::is_same_v<T, float>)
          return "number";
        else if constexpr (std::is_same_v<T, bool>)
          return "true / false";
        else if constexpr (std::is_same_v<T, Recompute>)
          return "true / false / \"auto\"";
        else
          return "string";  // std::string, ModelFamily, MoeScore
      },
      field);
}

// ---- overrides: "section.key=value" ----

struct Override {
  std::string text;
  const Key* key = nullptr;
  toml::table holder;  // {v = value}
};

Override parse_override(const std::string& text) {
  Override o;
  o.text = text;
  auto malformed = [&](std::string_view why) -> Override {
    fail("override '{}' is malformed: {}; expected section.key=value, e.g. model.n_layer=12", text,
         why);
  };
  size_t eq = text.find('=');
  if (eq == std::string::npos) return malformed("no '='");
  auto trim = [](std::string_view s) {
    size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    return b == std::string_view::npos ? std::string_view{} : s.substr(b, e - b + 1);
  };
  std::string_view lhs = trim(std::string_view(text).substr(0, eq));
  std::string_view rhs = trim(std::string_view(text).substr(eq + 1));
  size_t dot = lhs.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == lhs.size() ||
      lhs.find('.', dot + 1) != std::string_view::npos)
    return malformed(fmt::format("'{}' is not section.key", lhs));
  std::string_view section = lhs.substr(0, dot), name = lhs.substr(dot + 1);
  if (!is_section(section)) fail("override '{}': {}", text, unknown_section(section));
  o.key = find_key(section, name);
  if (!o.key) fail("override '{}': {}", text, unknown_key(section, name));

  // TOML first; a bare word that is not TOML (llama, runs/x) is a string, but text that
  // starts like a TOML string, array or table must be valid TOML.
  try {
    o.holder = toml::parse(fmt::format("v = {}", rhs));
    if (o.holder.size() != 1 || !o.holder.contains("v")) return malformed("more than one value");
  } catch (const toml::parse_error& e) {
    if (!rhs.empty() && std::string_view("\"'[{").find(rhs.front()) != std::string_view::npos)
      fail("override '{}': value is not valid TOML: {}", text, e.description());
    o.holder = toml::table{{"v", std::string(rhs)}};
  }
  return o;
}

}  // namespace

// ---- public ----

Config parse_recipe(std::string_view toml_text, const std::string& name,
                    const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(toml_text, name);
  } catch (const toml::parse_error& e) {
    fail("{}:{}:{}: {}", name, e.source().begin.line, e.source().begin.column, e.description());
  }
  std::vector<Override> parsed;  // all overrides are checked before any value is
  for (const std::string& text : overrides) parsed.push_back(parse_override(text));

  Config config;
  config.recipe_path = name;
  std::map<std::string, std::string> origins;  // full key -> where it was set
  auto origin_of = [&](const toml::node& node) {
    const auto& begin = node.source().begin;
    return begin.line ? fmt::format("{}:{}:{}", name, begin.line, begin.column) : name;
  };

  for (auto&& [section_key, section_node] : root) {
    std::string_view section = section_key.str();
    std::string at = origin_of(section_node);
    if (!section_node.is_table()) {
      for (const Key& k : key_table())
        if (k.name == section)
          fail("{}: key '{}' is outside any section; did you mean {} (under [{}])?", at, section,
               k.full(), k.section);
      if (is_section(section))
        fail("{}: [{}] must be a section, got {}", at, section, describe(section_node));
    }
    if (!is_section(section)) fail("{}: {}", at, unknown_section(section));
    for (auto&& [name_key, node] : *section_node.as_table()) {
      std::string where = origin_of(node);
      const Key* key = find_key(section, name_key.str());
      if (!key) fail("{}: {}", where, unknown_key(section, name_key.str()));
      set_value(config, *key, node, where);
      origins[key->full()] = where;
    }
  }
  for (const Override& o : parsed) {
    std::string where = fmt::format("{}: override '{}'", name, o.text);
    set_value(config, *o.key, *o.holder.get("v"), where);
    origins[o.key->full()] = where;
  }

  // Family defaults: GPT-2 ties the embedding and the LM head, LLaMA does not.
  if (!origins.contains("model.tie_embeddings"))
    config.model.tie_embeddings = config.model.family == ModelFamily::GPT2;

  check_combinations(config, origins, name);
  return config;
}

Config load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("cannot open recipe {}", path);
  std::stringstream text;
  text << file.rdbuf();
  Config config = parse_recipe(text.str(), path, overrides);
  // A file that sets nothing (empty, truncated, only comments) would train on the defaults
  // of config.h without a word; a recipe must say something.
  bool sets_a_key = false;
  for (auto&& [section, node] : toml::parse(text.str(), path))
    sets_a_key = sets_a_key || !node.is_table() || !node.as_table()->empty();
  if (!sets_a_key)
    fail(
        "{}: the recipe sets no key ({}): pentad would train on the defaults of every key; "
        "start from a recipe in recipes/ (e.g. recipes/gpt-tiny.toml)",
        path,
        text.str().find_first_not_of(" \t\r\n") == std::string::npos
            ? "the file is empty"
            : "only comments or empty sections");
  return config;
}

std::string recipe_to_toml(const Config& config) {
  Config copy = config;  // the table's accessors take a mutable Config
  std::string out = "# Effective recipe written by pentad: every key, defaults included.\n";
  std::string_view section;
  for (const Key& k : key_table()) {
    if (k.section != section) {
      out += fmt::format("{}[{}]\n", section.empty() ? "" : "\n", k.section);
      section = k.section;
    }
    out += fmt::format("{} = {}\n", k.name, format_value(k.field(copy)));
  }
  return out;
}

std::vector<std::string> recipe_keys() {
  std::vector<std::string> keys;
  for (const Key& k : key_table()) keys.push_back(k.full());
  return keys;
}

std::string recipe_keys_markdown() {
  // A table cell: '|' would end it.
  auto cell = [](std::string_view text) {
    std::string out;
    for (char ch : text) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return out;
  };
  Config defaults;  // the table's accessors take a mutable Config
  std::string out =
      "# Recipe keys\n"
      "\n"
      "Every key that a recipe (recipes/*.toml) or an override (`section.key=value`) can set.\n"
      "This file is generated by `pentad recipe keys --markdown` from the key table in\n"
      "src/recipe/recipe_keys.cpp and checked against it by a test: edit the table, then\n"
      "regenerate with `build/pentad recipe keys --markdown > docs/recipe-keys.md`; do not\n"
      "edit this file by hand. A default is what a recipe that leaves the key out gets\n"
      "(model.tie_embeddings excepted: it follows model.family). Rules that involve two keys\n"
      "are checked in src/recipe/recipe_checks.cpp.\n";
  std::string_view section;
  for (const Key& k : key_table()) {
    if (k.section != section) {
      out += fmt::format(
          "\n## [{}]\n\n| key | type | allowed | default | meaning |\n|---|---|---|---|---|\n",
          k.section);
      section = k.section;
    }
    const Field field = k.field(defaults);
    const bool unrestricted = k.rule.choices.empty() && k.rule.lo == -kInf && k.rule.hi == kInf;
    out += fmt::format("| `{}` | {} | {} | `{}` | {} |\n", k.name, field_type(field),
                       cell(unrestricted ? "any" : k.rule.text()), cell(format_value(field)),
                       cell(k.meaning));
  }
  return out;
}

}  // namespace pentad
