// Byte-level BPE to and from Hugging Face's tokenizer.json. What is read and what refused:
// the pre_tokenizer (ByteLevel, or a Sequence of Split(Regex) steps then ByteLevel), the
// BPE options that change ids (ignore_merges, byte_fallback, unk_token with fuse_unk), and
// added_tokens; a normalizer, dropout, subword affixes and added tokens that strip
// whitespace are refused by name.
#include <algorithm>
#include <array>
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

// The document, checked to hold a BPE model and no normalizer.
json parse_bpe_document(const std::string& text, const std::string& path) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not a valid JSON file ({})", path, e.what());
  }
  if (!doc.is_object() || !doc.contains("model") || !doc["model"].is_object())
    fail("{}: no \"model\" object; expected a Hugging Face tokenizer.json", path);
  const std::string type = string_or_empty(doc["model"], "type");
  if (type != "BPE")
    fail(
        "{}: model type is \"{}\", only \"BPE\" is supported in tokenizer.json (for "
        "SentencePiece models give their tokenizer.model)",
        path, type);
  if (doc.contains("normalizer") && !doc["normalizer"].is_null())
    fail("{}: normalizer {} is not supported: byte-level BPE takes the text as it is (null)", path,
         doc["normalizer"].dump());
  return doc;
}

struct PreTokenizer {
  std::vector<std::string> split_patterns;  // Split(Regex) steps, in order
  bool byte_level_regex = true;             // ByteLevel's use_regex
  bool add_prefix_space = false;
};

// pre_tokenizer: ByteLevel alone, or a Sequence of Split(Regex) steps ending in ByteLevel.
PreTokenizer read_pre_tokenizer(const json& doc, const std::string& path) {
  PreTokenizer r;
  const json pre = doc.value("pre_tokenizer", json());
  const std::string pre_type = pre.is_object() ? string_or_empty(pre, "type") : "";
  if (pre_type == "ByteLevel") {
    read_byte_level(pre, path, "pre_tokenizer", true, r.byte_level_regex, r.add_prefix_space);
  } else if (pre_type == "Sequence" && pre.contains("pretokenizers") &&
             pre["pretokenizers"].is_array() && !pre["pretokenizers"].empty()) {
    const json& steps = pre["pretokenizers"];
    for (size_t k = 0; k < steps.size(); ++k) {
      const std::string where = fmt::format("pre_tokenizer.pretokenizers[{}]", k);
      const std::string step_type = steps[k].is_object() ? string_or_empty(steps[k], "type") : "";
      const bool last = k + 1 == steps.size();
      if (step_type == "Split" && !last) {
        read_split(steps[k], path, where, r.split_patterns);
      } else if (step_type == "ByteLevel" && last) {
        read_byte_level(steps[k], path, where, k == 0, r.byte_level_regex, r.add_prefix_space);
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
  return r;
}

struct ModelOptions {
  bool ignore_merges, byte_fallback, fuse_unk;
};

// The model's options that change ids; those byte-level BPE has no use for are refused, and
// the vocab and merges are checked to be there.
ModelOptions read_model_options(const json& model, const std::string& path) {
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    fail("{}: model.dropout = {} is not supported (null or 0)", path, model["dropout"].dump());
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!string_or_empty(model, affix).empty())
      fail("{}: model.{} = \"{}\" is not supported (byte-level BPE uses none)", path, affix,
           string_or_empty(model, affix));
  ModelOptions r;
  r.ignore_merges = flag(model, "ignore_merges", false, path, "model");
  r.byte_fallback = flag(model, "byte_fallback", false, path, "model");
  r.fuse_unk = flag(model, "fuse_unk", false, path, "model");
  if (!model.contains("vocab") || !model["vocab"].is_object())
    fail("{}: model.vocab missing or not an object", path);
  if (!model.contains("merges") || !model["merges"].is_array())
    fail("{}: model.merges missing or not an array", path);
  return r;
}

struct AddedEntries {
  std::vector<AddedToken> list;                    // in the file's order
  std::unordered_map<std::string, int64_t> id_of;  // content -> id
};

// added_tokens: their vocab entries are raw text, not byte-level strings.
AddedEntries read_added_tokens(const json& doc, const std::string& path) {
  AddedEntries r;
  if (!doc.contains("added_tokens") || !doc["added_tokens"].is_array()) return r;
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
    r.id_of[token.content] = t["id"].get<int64_t>();
    r.list.push_back(token);
  }
  return r;
}

struct Vocab {
  std::vector<std::string> tokens;                 // id -> raw bytes (added: their content)
  std::vector<bool> added;                         // id -> an added token
  std::unordered_map<std::string, int32_t> id_of;  // byte-level string -> id
};

// model.vocab with the added tokens it lacks, checked to number its tokens 0..n-1.
Vocab read_vocab(const json& model, const std::unordered_map<std::string, int64_t>& added,
                 const std::string& path) {
  std::vector<std::pair<int64_t, std::string>> entries;  // (id, byte-level string)
  for (const auto& [key, value] : model["vocab"].items()) {
    if (!value.is_number_integer()) fail("{}: vocab entry \"{}\" has a non-integer id", path, key);
    entries.emplace_back(value.get<int64_t>(), key);
  }
  for (const auto& [content, id] : added)
    if (!model["vocab"].contains(content)) entries.emplace_back(id, content);
  std::sort(entries.begin(), entries.end());

  Vocab r;
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
    r.tokens.push_back(bytes);
    r.added.push_back(is_added);
    r.id_of[key] = static_cast<int32_t>(id);
  }
  return r;
}

// For ignore_merges: the bytes of every byte-level vocab entry -> its id (the first entry
// wins), so that a piece that is itself in the vocabulary is that token.
std::unordered_map<std::string, int32_t> whole_pieces(const json& vocab) {
  std::unordered_map<std::string, int32_t> id_of;
  for (const auto& [key, value] : vocab.items()) {
    std::string bytes;
    if (from_byte_level(key, bytes))
      id_of.emplace(bytes, static_cast<int32_t>(value.get<int64_t>()));
  }
  return id_of;
}

// model.unk_token's id; -1 without one.
int32_t unk_id(const json& model, const std::unordered_map<std::string, int32_t>& id_of,
               const std::string& path) {
  if (!model.contains("unk_token") || !model["unk_token"].is_string()) return -1;
  const std::string unk = model["unk_token"].get<std::string>();
  auto it = id_of.find(unk);
  if (it == id_of.end()) fail("{}: model.unk_token \"{}\" is not in the vocab", path, unk);
  return it->second;
}

// model.merges by rank, each as the ids (left, right, result); both of tokenizers' forms,
// "left right" and ["left", "right"], are read.
std::vector<std::array<int32_t, 3>> read_merges(
    const json& merges, const std::unordered_map<std::string, int32_t>& id_of,
    const std::string& path) {
  std::vector<std::array<int32_t, 3>> r;
  r.reserve(merges.size());
  for (size_t k = 0; k < merges.size(); ++k) {
    const json& m = merges[k];
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        fail("{}: merge {} \"{}\" is not of the form \"left right\"", path, k, s);
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      fail("{}: merge {} is {}; expected \"left right\" or [\"left\", \"right\"]", path, k,
           m.dump());
    }
    auto l = id_of.find(left), rt = id_of.find(right), result = id_of.find(left + right);
    if (l == id_of.end()) fail("{}: merge {} references unknown token \"{}\"", path, k, left);
    if (rt == id_of.end()) fail("{}: merge {} references unknown token \"{}\"", path, k, right);
    if (result == id_of.end())
      fail("{}: merge {} \"{} {}\" produces \"{}\", which is not in the vocab", path, k, left,
           right, left + right);
    r.push_back({l->second, rt->second, result->second});
  }
  return r;
}

}  // namespace

std::unique_ptr<BpeModel> BpeModel::from_json(const std::string& text, const std::string& path) {
  const json doc = parse_bpe_document(text, path);
  const json& model = doc["model"];
  auto tok = std::make_unique<BpeModel>();
  tok->path_ = path;
  PreTokenizer pre = read_pre_tokenizer(doc, path);
  tok->split_patterns_ = std::move(pre.split_patterns);
  tok->byte_level_regex_ = pre.byte_level_regex;
  tok->add_prefix_space_ = pre.add_prefix_space;
  const ModelOptions options = read_model_options(model, path);
  tok->ignore_merges_ = options.ignore_merges;
  tok->byte_fallback_ = options.byte_fallback;
  tok->fuse_unk_ = options.fuse_unk;

  AddedEntries added = read_added_tokens(doc, path);
  Vocab vocab = read_vocab(model, added.id_of, path);
  if (tok->ignore_merges_) tok->whole_piece_id_ = whole_pieces(model["vocab"]);
  tok->unk_id_ = unk_id(model, vocab.id_of, path);
  const std::vector<std::array<int32_t, 3>> merges =
      read_merges(model["merges"], vocab.id_of, path);
  tok->merges_.reserve(merges.size());
  for (const auto& [left, right, result] : merges) tok->merges_.push_back({left, right, result});
  tok->tokens_ = std::move(vocab.tokens);
  tok->added_ = std::move(vocab.added);
  tok->added_list_ = std::move(added.list);
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
