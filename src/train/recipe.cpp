#include "train/recipe.h"

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
#include "model/moe.h"
#include "train/recipe_keys.h"

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

std::string quote(std::string_view s);

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

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (ch < 0x20 || ch == 0x7f)
          out += fmt::format("\\u{:04X}", ch);
        else
          out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

// Shortest text that reads back as the same float through a TOML double.
std::string format_float(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", v);
  double back = 0;
  std::from_chars(s.data(), s.data() + s.size(), back);
  if (static_cast<float>(back) != v) s = fmt::format("{}", static_cast<double>(v));
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

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
        } else {
          if (!node.is_string()) must_be(key.rule.choices.empty() ? "a string" : key.rule.text());
          const std::string& word = node.as_string()->get();
          check_word(word);
          if constexpr (std::is_same_v<T, ModelFamily>)
            *dst = word == "llama" ? ModelFamily::LLaMA : ModelFamily::GPT2;
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
        else if constexpr (std::is_same_v<T, std::string>)
          return quote(*v);
        else if constexpr (std::is_same_v<T, ModelFamily>)
          return quote(family_name(*v));
        else
          return fmt::format("{}", *v);
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

// ---- checks that involve more than one key ----

std::string divisors_of(int64_t n) {
  std::string list;
  for (int64_t d = 1; d <= n && list.size() < 60; ++d)
    if (n % d == 0) list += fmt::format("{}{}", list.empty() ? "" : ", ", d);
  return list;
}

// Mixture of Experts (model/moe.h) against the rest of the recipe. where(keys): the origin
// of the first of `keys` the recipe set.
template <typename Where>
void check_moe(const Config& c, const Where& where) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  if (m.n_experts > 0 && m.moe_layers.empty())
    fail(
        "{}: model.n_experts = {} but model.moe_layers is empty: name the MoE layers (\"all\", "
        "\"every:2\", \"from:1\" or a list such as \"1,3\"), or set model.n_experts = 0 for a "
        "dense model",
        where({"model.moe_layers", "model.n_experts"}), m.n_experts);
  if (m.n_experts == 0 && !m.moe_layers.empty())
    fail(
        "{}: model.moe_layers = {} but model.n_experts = 0: set model.n_experts (e.g. 8), or "
        "model.moe_layers = \"\" for a dense model",
        where({"model.n_experts", "model.moe_layers"}), quote(m.moe_layers));
  if (!m.is_moe()) {
    if (m.n_shared_experts > 0 || m.d_ff_expert > 0)
      fail(
          "{}: model.{} is set but the model has no MoE layers: set model.n_experts and "
          "model.moe_layers, or leave it 0",
          where({"model.n_shared_experts", "model.d_ff_expert"}),
          m.n_shared_experts > 0 ? "n_shared_experts" : "d_ff_expert");
    if (p.ep > 1 || p.etp > 1)
      fail(
          "{}: parallel.ep = {} and parallel.etp = {} split experts, but the model has no MoE "
          "layers: set both to 1, or give the model experts (model.n_experts, model.moe_layers)",
          where({"parallel.ep", "parallel.etp"}), p.ep, p.etp);
    return;
  }
  std::vector<int64_t> layers;
  try {
    layers = moe_layer_indices(m);
  } catch (const Error& e) {
    fail("{}: {}", where({"model.moe_layers", "model.n_layer"}), e.what());
  }
  if (layers.empty())
    fail("{}: model.moe_layers = {} names no layer of the {} (layers 0 to {})",
         where({"model.moe_layers", "model.n_layer"}), quote(m.moe_layers), m.n_layer,
         m.n_layer - 1);
  if (m.top_k > m.n_experts)
    fail("{}: model.top_k ({}) must be at most model.n_experts ({})",
         where({"model.top_k", "model.n_experts"}), m.top_k, m.n_experts);
  const float capacity = m.moe.capacity_factor;
  if (capacity > 0 && double(capacity) * double(m.top_k) < 1.0)
    fail(
        "{}: moe.capacity_factor = {} is below 1 / model.top_k = 1 / {}: the experts together "
        "would keep fewer picks than a micro-batch has tokens, so even perfectly balanced "
        "routing drops tokens whole; use at least {:.4g} (1 or more keeps balanced routing "
        "whole), or 0 for dropless",
        where({"moe.capacity_factor", "model.top_k"}), format_float(capacity), m.top_k,
        1.0 / double(m.top_k));
  // MoE on CUDA runs in fp32 with every expert on its rank (its routing on host copies).
  if (c.train.device == "cuda" && c.train.precision != "fp32")
    fail(
        "{}: MoE on CUDA in {} is not built yet (it computes in fp32): set train.precision = "
        "\"fp32\"",
        where({"train.precision", "train.device", "model.n_experts"}), c.train.precision);
  if (c.train.device == "cuda" && (p.ep > 1 || p.etp > 1))
    fail(
        "{}: expert parallelism on CUDA is not built yet (parallel.ep = {}, parallel.etp = {} "
        "with train.device = \"cuda\"): set both to 1, or train on the CPU",
        where({"parallel.ep", "parallel.etp", "train.device"}), p.ep, p.etp);
  if (m.recompute)
    fail(
        "{}: model.recompute = true with MoE layers is not built yet (an MoE layer keeps its "
        "routing for backward): set model.recompute = false",
        where({"model.recompute", "model.n_experts"}));
  if (m.n_experts % p.ep != 0)
    fail(
        "{}: model.n_experts ({}) must be divisible by parallel.ep ({}): each expert-parallel "
        "rank holds n_experts / ep whole experts; change parallel.ep to a divisor of {} ({})",
        where({"parallel.ep", "model.n_experts"}), m.n_experts, p.ep, m.n_experts,
        divisors_of(m.n_experts));
  const int64_t width = expert_ffn_dim(m);
  if (width % p.etp != 0)
    fail(
        "{}: the expert width ({} = {}) must be divisible by parallel.etp ({}): change "
        "parallel.etp to a divisor of {} ({})",
        where({"parallel.etp", "model.d_ff_expert"}),
        m.d_ff_expert > 0 ? "model.d_ff_expert" : "model.d_ff_expert = 0: the ffn width", width,
        p.etp, width, divisors_of(width));
  const int64_t shared = m.n_shared_experts * width;
  if (shared % p.tp != 0)
    fail(
        "{}: the shared experts' width (model.n_shared_experts x expert width = {} x {} = {}) "
        "must be divisible by parallel.tp ({}): they run as one tensor-parallel MLP; change "
        "parallel.tp to a divisor of {}",
        where({"parallel.tp", "model.n_shared_experts"}), m.n_shared_experts, width, shared, p.tp,
        shared);
  if (p.tp > 1 && !p.sequence_parallel)
    fail(
        "{}: MoE layers with parallel.tp = {} need parallel.sequence_parallel = true: every rank "
        "must route distinct tokens (as in Megatron), not tp copies of the same ones",
        where({"parallel.tp", "parallel.sequence_parallel"}), p.tp);
}

void check_combinations(const Config& c, const std::map<std::string, std::string>& origins,
                        const std::string& name) {
  // The origin of the first named key that the recipe set, for "file:line:col: ..." prefixes.
  auto where = [&](std::initializer_list<std::string_view> keys) {
    for (auto k : keys)
      if (auto it = origins.find(std::string(k)); it != origins.end()) return it->second;
    return name;
  };
  const ModelConfig& m = c.model;
  if (m.d_model % m.n_head != 0)
    fail("{}: model.d_model ({}) must be divisible by model.n_head ({})",
         where({"model.d_model", "model.n_head"}), m.d_model, m.n_head);
  if (m.n_kv_head > m.n_head)
    fail("{}: model.n_kv_head ({}) must be in [0, model.n_head ({})]", where({"model.n_kv_head"}),
         m.n_kv_head, m.n_head);
  if (m.n_kv_head > 0 && m.n_head % m.n_kv_head != 0)
    fail("{}: model.n_head ({}) must be divisible by model.n_kv_head ({})",
         where({"model.n_kv_head", "model.n_head"}), m.n_head, m.n_kv_head);
  if (m.family == ModelFamily::GPT2 && m.n_kv_head != 0 && m.n_kv_head != m.n_head)
    fail(
        "{}: model.n_kv_head ({}) must be 0 or model.n_head ({}) when model.family = \"gpt2\" "
        "(GPT-2 has no grouped-query attention; use family \"llama\")",
        where({"model.n_kv_head", "model.family"}), m.n_kv_head, m.n_head);
  if (m.family == ModelFamily::LLaMA && m.head_dim() % 2 != 0)
    fail(
        "{}: head_dim = model.d_model / model.n_head = {} / {} = {} must be even when "
        "model.family = \"llama\" (RoPE rotates pairs of dimensions)",
        where({"model.d_model", "model.n_head", "model.family"}), m.d_model, m.n_head,
        m.head_dim());
  if (c.train.seq_len > m.max_seq_len)
    fail("{}: train.seq_len ({}) must be at most model.max_seq_len ({})",
         where({"train.seq_len", "model.max_seq_len"}), c.train.seq_len, m.max_seq_len);
  if (c.parallel.cp != 1)
    fail("{}: parallel.cp ({}) must be 1: context parallelism is not in this build yet",
         where({"parallel.cp"}), c.parallel.cp);
  const std::string& source = c.data.source;
  if ((source == "megatron" || source == "llmc" || source == "tokens") && c.data.path.empty())
    fail("{}: data.path is required when data.source = \"{}\" ({})", where({"data.source"}), source,
         source == "megatron" ? "prefix of a .bin/.idx pair"
         : source == "llmc"   ? "an llm.c .bin shard or a glob of them"
                              : "a pentad token file");
  if (c.train.out_dir.empty())
    fail("{}: train.out_dir must not be empty", where({"train.out_dir"}));
  if (c.train.precision == "bf16" && c.train.device != "cuda")
    fail(
        "{}: train.precision = \"bf16\" needs train.device = \"cuda\" (the CPU kernels "
        "compute in fp32): set train.precision = \"fp32\" or train on a GPU",
        where({"train.precision", "train.device"}));
  if (c.train.device == "cuda" && c.parallel.pp > 1)
    fail(
        "{}: parallel.pp = {} with train.device = \"cuda\" is not built yet (pipeline "
        "transfers go through host buffers): set parallel.pp = 1 or train on the CPU",
        where({"parallel.pp", "train.device"}), c.parallel.pp);
  if (c.train.device == "cuda" && m.head_dim() > 128)
    fail(
        "{}: head_dim = model.d_model / model.n_head = {} is above 128, the largest the CUDA "
        "attention kernels take: raise model.n_head",
        where({"model.d_model", "model.n_head", "train.device"}), m.head_dim());
  check_moe(c, where);
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

}  // namespace pentad
