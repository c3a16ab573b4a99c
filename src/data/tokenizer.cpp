// Byte-level BPE: pre-tokenization, encode/decode, and the tokenizer.json format.
// Training lives in bpe_train.cpp.
#include "data/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "data/token_files.h"

namespace pentad::data {

namespace {

enum ByteClass : uint8_t { kOther, kLetter, kDigit, kSpace };

// GPT-2 splits on Unicode classes (\p{L}, \p{N}, \s). We classify bytes instead: every
// byte >= 0x80 counts as a letter, so a multi-byte UTF-8 character is never split and
// non-ASCII text groups into words; non-ASCII punctuation and spaces (U+2014, U+00A0)
// then join words where GPT-2 would split them. Encoding stays lossless either way.
constexpr std::array<uint8_t, 256> make_byte_classes() {
  std::array<uint8_t, 256> classes{};
  for (int b = 0; b < 256; ++b) {
    uint8_t c = kOther;
    if ((b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || b >= 0x80) c = kLetter;
    if (b >= '0' && b <= '9') c = kDigit;
    if (b == ' ' || b == '\t' || b == '\n' || b == '\v' || b == '\f' || b == '\r') c = kSpace;
    classes[static_cast<size_t>(b)] = c;
  }
  return classes;
}
constexpr std::array<uint8_t, 256> kByteClass = make_byte_classes();

uint8_t byte_class(char c) {
  return kByteClass[static_cast<uint8_t>(c)];
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68
// bytes map to code points 256.. in byte order.
struct ByteAlphabet {
  std::array<std::string, 256> to_unicode;
  std::unordered_map<uint32_t, uint8_t> from_codepoint;

  ByteAlphabet() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cp = printable ? b : next++;
      std::string utf8;
      if (cp < 0x80) {
        utf8.push_back(static_cast<char>(cp));
      } else {  // every stand-in is below U+0800: two bytes
        utf8.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        utf8.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      to_unicode[b] = utf8;
      from_codepoint[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet instance;
  return instance;
}

std::string to_byte_level(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += alphabet().to_unicode[static_cast<uint8_t>(c)];
  return out;
}

// Inverse of to_byte_level; false if `text` has a character outside the alphabet.
bool from_byte_level(const std::string& text, std::string& bytes) {
  bytes.clear();
  const auto& table = alphabet().from_codepoint;
  for (size_t i = 0; i < text.size();) {
    auto c = static_cast<uint8_t>(text[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < text.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<uint8_t>(text[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;
    }
    auto it = table.find(cp);
    if (it == table.end()) return false;
    bytes.push_back(static_cast<char>(it->second));
  }
  return true;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

const std::string& byte_to_unicode(uint8_t byte) {
  return alphabet().to_unicode[byte];
}

// The GPT-2 rule: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  pieces.reserve(text.size() / 4 + 1);
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    if (text[i] == '\'' && i + 1 < n) {
      char d = text[i + 1];
      if (d == 's' || d == 't' || d == 'm' || d == 'd') {
        pieces.push_back(text.substr(i, 2));
        i += 2;
        continue;
      }
      if (i + 2 < n) {
        char e = text[i + 2];
        if ((d == 'r' && e == 'e') || (d == 'v' && e == 'e') || (d == 'l' && e == 'l')) {
          pieces.push_back(text.substr(i, 3));
          i += 3;
          continue;
        }
      }
    }
    size_t start = i;  // one space may lead a word, a number or a run of punctuation
    if (text[i] == ' ' && i + 1 < n && byte_class(text[i + 1]) != kSpace) ++start;
    uint8_t cls = byte_class(text[start]);
    size_t end = start + 1;
    if (cls != kSpace) {
      while (end < n && byte_class(text[end]) == cls) ++end;
    } else {
      while (end < n && byte_class(text[end]) == kSpace) ++end;
      // \s+(?!\S): a run followed by text gives up its last character, which then leads
      // the next piece (a space) or stands alone (any other whitespace).
      if (end < n && end - start >= 2) --end;
    }
    pieces.push_back(text.substr(i, end - i));
    i = end;
  }
  return pieces;
}

void Tokenizer::build_lookup() {
  byte_id_.fill(-1);
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (!special_[id] && tokens_[id].size() == 1) {
      auto b = static_cast<uint8_t>(tokens_[id][0]);
      if (byte_id_[b] < 0) byte_id_[b] = static_cast<int32_t>(id);
    }
  }
  merge_rank_.clear();
  merge_rank_.reserve(merges_.size());
  for (size_t r = 0; r < merges_.size(); ++r) {
    merge_rank_.emplace(pair_key(merges_[r].left, merges_[r].right), static_cast<int32_t>(r));
  }
  eot_id_ = -1;
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (special_[id] && tokens_[id] == kEndOfText) eot_id_ = static_cast<int32_t>(id);
  }
  cache_.clear();
}

// Applies merges by rank: repeatedly merge every occurrence of the lowest-ranked pair.
void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<int32_t> ids;
  ids.reserve(piece.size());
  for (char c : piece) {
    int32_t id = byte_id_[static_cast<uint8_t>(c)];
    if (id < 0)
      fail("tokenizer has no token for byte 0x{:02x}; cannot encode this text",
           static_cast<uint8_t>(c));
    ids.push_back(id);
  }
  while (ids.size() >= 2) {
    int32_t best_rank = -1;
    for (size_t k = 0; k + 1 < ids.size(); ++k) {
      auto it = merge_rank_.find(pair_key(ids[k], ids[k + 1]));
      if (it != merge_rank_.end() && (best_rank < 0 || it->second < best_rank))
        best_rank = it->second;
    }
    if (best_rank < 0) break;
    const Merge& m = merges_[static_cast<size_t>(best_rank)];
    size_t w = 0;
    for (size_t k = 0; k < ids.size(); ++k) {
      if (k + 1 < ids.size() && ids[k] == m.left && ids[k + 1] == m.right) {
        ids[w++] = m.result;
        ++k;
      } else {
        ids[w++] = ids[k];
      }
    }
    ids.resize(w);
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

void Tokenizer::encode_into(std::string_view text, PieceCache& cache,
                            std::vector<int32_t>& out) const {
  constexpr size_t kMaxCached = 1 << 20;  // bounds memory on huge, varied inputs
  for (std::string_view piece : pretokenize(text)) {
    auto it = cache.find(piece);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      continue;
    }
    size_t before = out.size();
    encode_piece(piece, out);
    if (cache.size() >= kMaxCached) cache.clear();
    cache.emplace(
        std::string(piece),
        std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(before), out.end()));
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  encode_into(text, cache_, out);
  return out;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(
    std::span<const std::string_view> texts) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  const auto n = static_cast<int64_t>(texts.size());
  std::string error;
#pragma omp parallel
  {
    PieceCache cache;  // one per thread: no locking on the hot path
#pragma omp for schedule(dynamic, 64)
    for (int64_t i = 0; i < n; ++i) {
      try {
        encode_into(texts[static_cast<size_t>(i)], cache, out[static_cast<size_t>(i)]);
      } catch (const Error& e) {
#pragma omp critical(pentad_encode_error)
        if (error.empty()) error = e.what();
      }
    }
  }
  if (!error.empty()) throw Error(error);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      fail("cannot decode token id {}: vocabulary has {} tokens", id, vocab_size());
    text += tokens_[static_cast<size_t>(id)];
  }
  return text;
}

// ---- tokenizer.json ----

void Tokenizer::save(const std::string& path) const {
  using ordered_json = nlohmann::ordered_json;
  ordered_json vocab = ordered_json::object();
  ordered_json added = ordered_json::array();
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (special_[id]) {
      vocab[tokens_[id]] = id;
      added.push_back({{"id", id},
                       {"content", tokens_[id]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", true},
                       {"special", true}});
    } else {
      vocab[to_byte_level(tokens_[id])] = id;
    }
  }
  ordered_json merges = ordered_json::array();
  for (const Merge& m : merges_) {
    // Byte-level strings never contain ' ' (it is "Ġ"), so "left right" is unambiguous.
    merges.push_back(to_byte_level(tokens_[static_cast<size_t>(m.left)]) + " " +
                     to_byte_level(tokens_[static_cast<size_t>(m.right)]));
  }
  ordered_json byte_level = {{"type", "ByteLevel"},
                             {"add_prefix_space", false},
                             {"trim_offsets", true},
                             {"use_regex", true}};
  ordered_json doc;
  doc["version"] = "1.0";
  doc["truncation"] = nullptr;
  doc["padding"] = nullptr;
  doc["added_tokens"] = added;
  doc["normalizer"] = nullptr;
  doc["pre_tokenizer"] = byte_level;
  doc["post_processor"] = byte_level;
  doc["decoder"] = byte_level;
  doc["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"continuing_subword_prefix", ""},
                  {"end_of_word_suffix", ""},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"vocab", vocab},
                  {"merges", merges}};
  const std::string text = doc.dump(1) + "\n";
  write_file_atomically(path, text.data(), text.size());
}

namespace {

bool has_byte_level(const nlohmann::json& pre) {
  if (!pre.is_object()) return false;
  std::string type = pre.value("type", "");
  if (type == "ByteLevel") return true;
  if (type == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array()) {
    for (const auto& p : pre["pretokenizers"]) {
      if (has_byte_level(p)) return true;
    }
  }
  return false;
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("{}: cannot open tokenizer file", path);
  std::stringstream buffer;
  buffer << file.rdbuf();
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(buffer.str());
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not a valid JSON file ({})", path, e.what());
  }
  if (!doc.is_object() || !doc.contains("model") || !doc["model"].is_object()) {
    fail("{}: no \"model\" object; expected a Hugging Face tokenizer.json", path);
  }
  const auto& model = doc["model"];
  std::string type =
      model.contains("type") && model["type"].is_string() ? model["type"].get<std::string>() : "";
  if (type != "BPE") fail("{}: model type is \"{}\", only \"BPE\" is supported", path, type);
  if (!has_byte_level(doc.value("pre_tokenizer", nlohmann::json()))) {
    fail(
        "{}: pre_tokenizer is not ByteLevel; only byte-level BPE (GPT-2 style) tokenizers are "
        "supported",
        path);
  }
  if (!model.contains("vocab") || !model["vocab"].is_object())
    fail("{}: model.vocab missing or not an object", path);
  if (!model.contains("merges") || !model["merges"].is_array())
    fail("{}: model.merges missing or not an array", path);

  // Special tokens first: their vocab entries are raw text, not byte-level strings.
  std::unordered_map<std::string, int64_t> specials;
  if (doc.contains("added_tokens") && doc["added_tokens"].is_array()) {
    for (const auto& t : doc["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
          !t.contains("content") || !t["content"].is_string()) {
        fail("{}: added_tokens entry {} needs an integer \"id\" and a string \"content\"", path,
             t.dump());
      }
      specials[t["content"].get<std::string>()] = t["id"].get<int64_t>();
    }
  }

  std::vector<std::pair<int64_t, std::string>> entries;  // (id, byte-level string)
  for (const auto& [key, value] : model["vocab"].items()) {
    if (!value.is_number_integer()) fail("{}: vocab entry \"{}\" has a non-integer id", path, key);
    entries.emplace_back(value.get<int64_t>(), key);
  }
  for (const auto& [content, id] : specials) {
    if (!model["vocab"].contains(content)) entries.emplace_back(id, content);
  }
  std::sort(entries.begin(), entries.end());

  Tokenizer tok;
  std::unordered_map<std::string, int32_t> id_of;  // byte-level string -> id
  for (size_t k = 0; k < entries.size(); ++k) {
    const auto& [id, key] = entries[k];
    if (id != static_cast<int64_t>(k)) {
      if (k > 0 && id == entries[k - 1].first) fail("{}: token id {} is used twice", path, id);
      fail("{}: token ids are not contiguous: id {} is missing", path, k);
    }
    std::string bytes;
    bool special = specials.count(key) > 0 && specials.at(key) == id;
    if (special) {
      bytes = key;
    } else if (!from_byte_level(key, bytes)) {
      fail("{}: vocab token \"{}\" (id {}) has characters outside the byte-level alphabet", path,
           key, id);
    }
    tok.tokens_.push_back(bytes);
    tok.special_.push_back(special);
    id_of[key] = static_cast<int32_t>(id);
  }

  const auto& merges = model["merges"];
  tok.merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& m = merges[r];
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        fail("{}: merge {} \"{}\" is not of the form \"left right\"", path, r, s);
      }
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
    tok.merges_.push_back({l->second, rt->second, result->second});
  }
  tok.build_lookup();
  return tok;
}

}  // namespace pentad::data
