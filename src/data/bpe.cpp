// Byte-level BPE encoding and decoding. tokenizer.json: bpe_json.cpp; training: bpe_train.cpp.
#include "data/bpe.h"

#include <fmt/format.h>

#include "core/check.h"
#include "data/byte_level.h"

namespace pentad::data {

namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

struct BpePieceHash {  // lets the cache be probed with a string_view
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// One thread's state: its piece cache and its match data for each pattern.
struct BpeModel::Scratch final : EncodeScratch {
  std::unordered_map<std::string, std::vector<int32_t>, BpePieceHash, std::equal_to<>> cache;
  std::vector<std::unique_ptr<RegexScratch>> regex;
  std::vector<AddedTokens::Segment> segments;
  std::vector<std::string_view> pieces, next;
  std::string prefixed;  // add_prefix_space's copy of a stretch
};

std::unique_ptr<TokenizerModel> BpeModel::clone() const {
  return std::make_unique<BpeModel>(*this);
}

std::unique_ptr<EncodeScratch> BpeModel::make_scratch() const {
  auto s = std::make_unique<Scratch>();
  for (const auto& splitter : splitters_) s->regex.push_back(splitter->make_scratch());
  return s;
}

void BpeModel::build_lookup() {
  const std::string where = path_.empty() ? std::string("trained tokenizer") : path_;
  splitters_.clear();
  for (size_t k = 0; k < split_patterns_.size(); ++k)
    splitters_.push_back(std::make_shared<const RegexSplitter>(
        split_patterns_[k], fmt::format("{}: pre_tokenizer Split {}", where, k)));
  if (byte_level_regex_)
    splitters_.push_back(std::make_shared<const RegexSplitter>(
        kGpt2Pattern, fmt::format("{}: pre_tokenizer ByteLevel", where)));

  std::unordered_map<std::string, int32_t> plain_id;  // bytes -> id, added tokens left out
  for (size_t id = 0; id < tokens_.size(); ++id)
    if (!added_[id]) plain_id.emplace(tokens_[id], static_cast<int32_t>(id));
  byte_id_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    auto it = plain_id.find(std::string(1, static_cast<char>(b)));
    if (it != plain_id.end()) byte_id_[static_cast<size_t>(b)] = it->second;
  }
  fallback_byte_.clear();
  for (int b = 0; b < 256; ++b) {  // "<0x0A>": Hugging Face's spelling of byte tokens
    auto it = plain_id.find(fmt::format("<0x{:02X}>", b));
    if (it != plain_id.end()) fallback_byte_[it->second] = static_cast<uint8_t>(b);
  }
  for (int b = 0; b < 256; ++b) {  // the fallback of a byte is the bytes of its stand-in
    const std::string& stand_in = byte_to_unicode(static_cast<uint8_t>(b));
    auto& ids = fallback_ids_[static_cast<size_t>(b)];
    ids = {-1, -1};
    for (size_t k = 0; k < stand_in.size(); ++k) {
      auto it = plain_id.find(fmt::format("<0x{:02X}>", static_cast<uint8_t>(stand_in[k])));
      ids[k] = it == plain_id.end() ? -1 : it->second;
    }
  }
  merge_rank_.clear();
  merge_rank_.reserve(merges_.size());
  for (size_t r = 0; r < merges_.size(); ++r)  // a repeated pair keeps its first (lowest) rank
    merge_rank_.emplace(pair_key(merges_[r].left, merges_[r].right), static_cast<int32_t>(r));

  added_tokens_ = AddedTokens(added_list_);
  eot_id_ = -1;
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>"})
    if (eot_id_ < 0) eot_id_ = special_id(name);
  bos_id_ = -1;
  for (const char* name : {"<|begin_of_text|>", "<s>", "<|startoftext|>"})
    if (bos_id_ < 0) bos_id_ = special_id(name);
}

int32_t BpeModel::special_id(std::string_view content) const {
  for (const AddedToken& t : added_list_)
    if (t.special && t.content == content) return t.id;
  return -1;
}

const std::string& BpeModel::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail("token id {} is outside the vocabulary [0, {})", id, vocab_size());
  return tokens_[static_cast<size_t>(id)];
}

// Applies merges by rank: repeatedly merge every occurrence of the lowest-ranked pair.
void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    auto whole = whole_piece_id_.find(std::string(piece));
    if (whole != whole_piece_id_.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(piece.size());
  bool last_was_unk = false;
  for (char c : piece) {
    const auto b = static_cast<uint8_t>(c);
    if (byte_id_[b] >= 0) {
      ids.push_back(byte_id_[b]);
      last_was_unk = false;
      continue;
    }
    const auto& fallback = fallback_ids_[b];
    const size_t width = byte_to_unicode(b).size();
    if (byte_fallback_ && fallback[0] >= 0 && (width == 1 || fallback[1] >= 0)) {
      ids.insert(ids.end(), fallback.begin(),
                 fallback.begin() + static_cast<std::ptrdiff_t>(width));
      last_was_unk = false;
    } else if (unk_id_ >= 0) {
      if (!(fuse_unk_ && last_was_unk)) ids.push_back(unk_id_);
      last_was_unk = true;
    } else {
      fail(
          "{}: byte 0x{:02x} (\"{}\" in the byte-level alphabet) has no token, and the "
          "tokenizer has neither byte_fallback tokens for it nor an unk_token; cannot encode "
          "this text",
          path_.empty() ? "tokenizer" : path_, b, byte_to_unicode(b));
    }
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

void BpeModel::encode_stretch(std::string_view text, Scratch& s, std::vector<int32_t>& out) const {
  if (add_prefix_space_ && !text.starts_with(' ')) {
    s.prefixed.assign(" ");
    s.prefixed.append(text);
    text = s.prefixed;
  }
  s.pieces.assign(1, text);
  for (size_t k = 0; k < splitters_.size(); ++k) {
    s.next.clear();
    for (std::string_view piece : s.pieces) splitters_[k]->split(piece, *s.regex[k], s.next);
    std::swap(s.pieces, s.next);
  }
  constexpr size_t kMaxCached = 1 << 20;  // bounds memory on huge, varied inputs
  for (std::string_view piece : s.pieces) {
    auto it = s.cache.find(piece);
    if (it != s.cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      continue;
    }
    const size_t before = out.size();
    encode_piece(piece, out);
    if (s.cache.size() >= kMaxCached) s.cache.clear();
    s.cache.emplace(
        std::string(piece),
        std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(before), out.end()));
  }
}

void BpeModel::encode_into(std::string_view text, bool allow_special, EncodeScratch& scratch,
                           std::vector<int32_t>& out) const {
  auto& s = static_cast<Scratch&>(scratch);
  if (!added_tokens_.active(allow_special)) {
    if (!text.empty()) encode_stretch(text, s, out);
    return;
  }
  s.segments.clear();
  added_tokens_.split(text, allow_special, s.segments);
  for (const AddedTokens::Segment& segment : s.segments) {
    if (segment.id >= 0)
      out.push_back(segment.id);
    else
      encode_stretch(segment.text, s, out);
  }
}

std::string BpeModel::decode(std::span<const int32_t> ids) const {
  std::string text, fallback;  // fallback: byte tokens' bytes, which spell stand-ins
  auto flush = [&] {
    std::string bytes;
    text += from_byte_level(fallback, bytes) ? bytes : fallback;
    fallback.clear();
  };
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      fail("cannot decode token id {}: vocabulary has {} tokens", id, vocab_size());
    auto it = byte_fallback_ ? fallback_byte_.find(id) : fallback_byte_.end();
    if (it != fallback_byte_.end()) {
      fallback.push_back(static_cast<char>(it->second));
      continue;
    }
    if (!fallback.empty()) flush();
    text += tokens_[static_cast<size_t>(id)];
  }
  if (!fallback.empty()) flush();
  return text;
}

}  // namespace pentad::data
