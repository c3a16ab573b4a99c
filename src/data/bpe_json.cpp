// Byte-level BPE to and from Hugging Face's tokenizer.json. What is read and what refused:
// the pre_tokenizer (ByteLevel, or a Sequence of Split(Regex) steps then ByteLevel), the
// BPE options that change ids (ignore_merges, byte_fallback, unk_token with fuse_unk), and
// added_tokens; a normalizer, dropout, subword affixes and added tokens that strip
// whitespace are refused by name.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "data/bpe.h"
#include "data/byte_level.h"
#include "data/token_files.h"

namespace pentad::data {

namespace {

using json = nlohmann::json;

bool flag(const json& object, const char* key, bool fallback, const std::string& path,
          const std::string& where) {
  if (!object.contains(key) || object[key].is_null()) return fallback;
  if (!object[key].is_boolean()) fail("{}: {}.{} must be true or false", path, where, key);
  return object[key].get<bool>();
}

std::string string_or_empty(const json& object, const char* key) {
  return object.contains(key) && object[key].is_string() ? object[key].get<std::string>() : "";
}

// ByteLevel's own options; `alone`: no Split before it (add_prefix_space is per stretch).
void read_byte_level(const json& step, const std::string& path, const std::string& where,
                     bool alone, bool& use_regex, bool& add_prefix_space) {
  use_regex = flag(step, "use_regex", true, path, where);
  add_prefix_space = flag(step, "add_prefix_space", false, path, where);
  if (add_prefix_space && !alone)
    fail("{}: {}.add_prefix_space = true after a Split is not supported (set it false)", path,
         where);
}

void read_split(const json& step, const std::string& path, const std::string& where,
                std::vector<std::string>& patterns) {
  if (!step.contains("pattern") || !step["pattern"].is_object() ||
      !step["pattern"].contains("Regex") || !step["pattern"]["Regex"].is_string())
    fail("{}: {}.pattern must be {{\"Regex\": \"...\"}} (a String pattern is not supported)", path,
         where);
  const std::string behavior = string_or_empty(step, "behavior");
  if (behavior != "Isolated")
    fail("{}: {}.behavior is \"{}\"; only \"Isolated\" is supported", path, where, behavior);
  if (flag(step, "invert", false, path, where))
    fail("{}: {}.invert = true is not supported", path, where);
  patterns.push_back(step["pattern"]["Regex"].get<std::string>());
}

}  // namespace

std::unique_ptr<BpeModel> BpeModel::from_json(const std::string& text, const std::string& path) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not a valid JSON file ({})", path, e.what());
  }
  if (!doc.is_object() || !doc.contains("model") || !doc["model"].is_object())
    fail("{}: no \"model\" object; expected a Hugging Face tokenizer.json", path);
  const json& model = doc["model"];
  const std::string type = string_or_empty(model, "type");
  if (type != "BPE")
    fail(
        "{}: model type is \"{}\", only \"BPE\" is supported in tokenizer.json (for "
        "SentencePiece models give their tokenizer.model)",
        path, type);
  if (doc.contains("normalizer") && !doc["normalizer"].is_null())
    fail("{}: normalizer {} is not supported: byte-level BPE takes the text as it is (null)", path,
         doc["normalizer"].dump());

  auto tok = std::make_unique<BpeModel>();
  tok->path_ = path;
  // ---- pre_tokenizer ----
  const json pre = doc.value("pre_tokenizer", json());
  const std::string pre_type = pre.is_object() ? string_or_empty(pre, "type") : "";
  if (pre_type == "ByteLevel") {
    read_byte_level(pre, path, "pre_tokenizer", true, tok->byte_level_regex_,
                    tok->add_prefix_space_);
  } else if (pre_type == "Sequence" && pre.contains("pretokenizers") &&
             pre["pretokenizers"].is_array() && !pre["pretokenizers"].empty()) {
    const json& steps = pre["pretokenizers"];
    for (size_t k = 0; k < steps.size(); ++k) {
      const std::string where = fmt::format("pre_tokenizer.pretokenizers[{}]", k);
      const std::string step_type = steps[k].is_object() ? string_or_empty(steps[k], "type") : "";
      const bool last = k + 1 == steps.size();
      if (step_type == "Split" && !last) {
        read_split(steps[k], path, where, tok->split_patterns_);
      } else if (step_type == "ByteLevel" && last) {
        read_byte_level(steps[k], path, where, k == 0, tok->byte_level_regex_,
                        tok->add_prefix_space_);
      } else {
        fail(
            "{}: {} is {}; supported: Split(Regex) steps, then ByteLevel as the last step "
            "(GPT-2 and LLaMA-3 style)",
            path, where, steps[k].dump());
      }
    }
  } else {
    fail(
        "{}: pre_tokenizer is not ByteLevel (nor a Sequence of Split steps ending in "
        "ByteLevel); only byte-level BPE tokenizers (GPT-2, LLaMA-3 style) load from "
        "tokenizer.json; for a SentencePiece-based model (LLaMA-2, Mistral: Metaspace) give "
        "its tokenizer.model",
        path);
  }
  // ---- model options ----
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    fail("{}: model.dropout = {} is not supported (null or 0)", path, model["dropout"].dump());
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!string_or_empty(model, affix).empty())
      fail("{}: model.{} = \"{}\" is not supported (byte-level BPE uses none)", path, affix,
           string_or_empty(model, affix));
  tok->ignore_merges_ = flag(model, "ignore_merges", false, path, "model");
  tok->byte_fallback_ = flag(model, "byte_fallback", false, path, "model");
  tok->fuse_unk_ = flag(model, "fuse_unk", false, path, "model");
  if (!model.contains("vocab") || !model["vocab"].is_object())
    fail("{}: model.vocab missing or not an object", path);
  if (!model.contains("merges") || !model["merges"].is_array())
    fail("{}: model.merges missing or not an array", path);

  // ---- added_tokens: their vocab entries are raw text, not byte-level strings ----
  std::unordered_map<std::string, int64_t> added;
  if (doc.contains("added_tokens") && doc["added_tokens"].is_array()) {
    const json& list = doc["added_tokens"];
    for (size_t k = 0; k < list.size(); ++k) {
      const json& t = list[k];
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
          !t.contains("content") || !t["content"].is_string()) {
        fail("{}: added_tokens entry {} needs an integer \"id\" and a string \"content\"", path,
             t.dump());
      }
      const std::string where = fmt::format("added_tokens[{}]", k);
      for (const char* option : {"lstrip", "rstrip", "single_word"})
        if (flag(t, option, false, path, where))
          fail("{}: {}.{} = true ({}) is not supported", path, where, option,
               t["content"].get<std::string>());
      AddedToken token;
      token.content = t["content"].get<std::string>();
      token.id = static_cast<int32_t>(t["id"].get<int64_t>());
      token.special = flag(t, "special", true, path, where);
      token.normalized = flag(t, "normalized", !token.special, path, where);
      added[token.content] = t["id"].get<int64_t>();
      tok->added_list_.push_back(token);
    }
  }

  std::vector<std::pair<int64_t, std::string>> entries;  // (id, byte-level string)
  for (const auto& [key, value] : model["vocab"].items()) {
    if (!value.is_number_integer()) fail("{}: vocab entry \"{}\" has a non-integer id", path, key);
    entries.emplace_back(value.get<int64_t>(), key);
    std::string bytes;
    if (tok->ignore_merges_ && from_byte_level(key, bytes))
      tok->whole_piece_id_.emplace(bytes, static_cast<int32_t>(value.get<int64_t>()));
  }
  for (const auto& [content, id] : added)
    if (!model["vocab"].contains(content)) entries.emplace_back(id, content);
  std::sort(entries.begin(), entries.end());

  std::unordered_map<std::string, int32_t> id_of;  // byte-level string -> id
  for (size_t k = 0; k < entries.size(); ++k) {
    const auto& [id, key] = entries[k];
    if (id != static_cast<int64_t>(k)) {
      if (k > 0 && id == entries[k - 1].first) fail("{}: token id {} is used twice", path, id);
      fail("{}: token ids are not contiguous: id {} is missing", path, k);
    }
    std::string bytes;
    const bool is_added = added.count(key) > 0 && added.at(key) == id;
    if (is_added) {
      bytes = key;
    } else if (!from_byte_level(key, bytes)) {
      fail("{}: vocab token \"{}\" (id {}) has characters outside the byte-level alphabet", path,
           key, id);
    }
    tok->tokens_.push_back(bytes);
    tok->added_.push_back(is_added);
    id_of[key] = static_cast<int32_t>(id);
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const std::string unk = model["unk_token"].get<std::string>();
    auto it = id_of.find(unk);
    if (it == id_of.end()) fail("{}: model.unk_token \"{}\" is not in the vocab", path, unk);
    tok->unk_id_ = it->second;
  }

  const json& merges = model["merges"];
  tok->merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& m = merges[r];
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        fail("{}: merge {} \"{}\" is not of the form \"left right\"", path, r, s);
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      fail("{}: merge {} is {}; expected \"left right\" or [\"left\", \"right\"]", path, r,
           m.dump());
    }
    auto l = id_of.find(left), rt = id_of.find(right), result = id_of.find(left + right);
    if (l == id_of.end()) fail("{}: merge {} references unknown token \"{}\"", path, r, left);
    if (rt == id_of.end()) fail("{}: merge {} references unknown token \"{}\"", path, r, right);
    if (result == id_of.end())
      fail("{}: merge {} \"{} {}\" produces \"{}\", which is not in the vocab", path, r, left,
           right, left + right);
    tok->merges_.push_back({l->second, rt->second, result->second});
  }
  tok->build_lookup();
  return tok;
}

void BpeModel::save(const std::string& path) const {
  using ordered_json = nlohmann::ordered_json;
  ordered_json vocab = ordered_json::object();
  ordered_json added = ordered_json::array();
  for (const AddedToken& t : added_list_) {
    added.push_back({{"id", t.id},
                     {"content", t.content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", t.normalized},
                     {"special", t.special}});
  }
  for (size_t id = 0; id < tokens_.size(); ++id)
    vocab[added_[id] ? tokens_[id] : to_byte_level(tokens_[id])] = id;
  ordered_json merges = ordered_json::array();
  for (const Merge& m : merges_) {
    // Byte-level strings never contain ' ' (it is "Ġ"), so "left right" is unambiguous.
    merges.push_back(to_byte_level(tokens_[static_cast<size_t>(m.left)]) + " " +
                     to_byte_level(tokens_[static_cast<size_t>(m.right)]));
  }
  ordered_json byte_level = {{"type", "ByteLevel"},
                             {"add_prefix_space", add_prefix_space_},
                             {"trim_offsets", true},
                             {"use_regex", byte_level_regex_}};
  ordered_json pre = byte_level;
  if (!split_patterns_.empty()) {
    ordered_json steps = ordered_json::array();
    for (const std::string& p : split_patterns_)
      steps.push_back({{"type", "Split"},
                       {"pattern", {{"Regex", p}}},
                       {"behavior", "Isolated"},
                       {"invert", false}});
    steps.push_back(byte_level);
    pre = {{"type", "Sequence"}, {"pretokenizers", steps}};
  }
  ordered_json doc;
  doc["version"] = "1.0";
  doc["truncation"] = nullptr;
  doc["padding"] = nullptr;
  doc["added_tokens"] = added;
  doc["normalizer"] = nullptr;
  doc["pre_tokenizer"] = pre;
  doc["post_processor"] = byte_level;
  doc["decoder"] = byte_level;
  doc["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", unk_id_ >= 0 ? ordered_json(tokens_[static_cast<size_t>(unk_id_)])
                                             : ordered_json(nullptr)},
                  {"continuing_subword_prefix", ""},
                  {"end_of_word_suffix", ""},
                  {"fuse_unk", fuse_unk_},
                  {"byte_fallback", byte_fallback_}};
  if (ignore_merges_) doc["model"]["ignore_merges"] = true;
  doc["model"]["vocab"] = vocab;
  doc["model"]["merges"] = merges;
  const std::string text = doc.dump(1) + "\n";
  write_file_atomically(path, text.data(), text.size());
}

}  // namespace pentad::data
