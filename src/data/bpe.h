#pragma once
// Byte-level BPE as Hugging Face tokenizers runs it, read from and written to tokenizer.json:
// added tokens are cut out of the text first (added_tokens.h), each stretch between them is
// split into pieces by the pre-tokenizer's regexes (GPT-2's rule from ByteLevel, or a
// Split(Regex) such as LLaMA-3's), each piece's bytes start as one token each, and merges
// apply by rank within a piece. With ignore_merges (LLaMA-3) a piece that is itself in the
// vocabulary is that token.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/added_tokens.h"
#include "data/regex_split.h"
#include "data/tokenizer_model.h"

namespace pentad::data {

class BpeModel final : public TokenizerModel {
 public:
  // Learns merges on `documents` (bpe_train.cpp): 256 byte tokens, merges until
  // vocab_size - 1 tokens, then "<|endoftext|>" as the last id; GPT-2's pre-tokenizer.
  // progress: a progress line (core/progress.h) while counting and while merging.
  static std::unique_ptr<BpeModel> train(std::span<const std::string_view> documents,
                                         int64_t vocab_size, bool progress = false);
  // Parses the text of a tokenizer.json (bpe_json.cpp); `path` names it in messages.
  static std::unique_ptr<BpeModel> from_json(const std::string& text, const std::string& path);
  void save(const std::string& path) const override;

  std::unique_ptr<TokenizerModel> clone() const override;
  std::string_view kind() const override { return "byte-level BPE"; }
  std::unique_ptr<EncodeScratch> make_scratch() const override;
  void encode_into(std::string_view text, bool allow_special, EncodeScratch& scratch,
                   std::vector<int32_t>& out) const override;
  std::string decode(std::span<const int32_t> ids) const override;

  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  int32_t special_id(std::string_view content) const override;
  int32_t eot_id() const override { return eot_id_; }
  int32_t bos_id() const override { return bos_id_; }
  int64_t num_merges() const override { return static_cast<int64_t>(merges_.size()); }
  const std::string& token_bytes(int32_t id) const override;

 private:
  struct Merge {
    int32_t left, right, result;
  };
  struct Scratch;

  void build_lookup();  // everything below tokens_ / merges_ / the options, derived
  void encode_stretch(std::string_view text, Scratch& scratch, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::string path_;                 // where it was read from, for messages ("" if trained)
  std::vector<std::string> tokens_;  // id -> raw bytes (added tokens: their content)
  std::vector<bool> added_;          // id -> listed in added_tokens
  std::vector<AddedToken> added_list_;
  std::vector<Merge> merges_;  // by rank

  // The pre-tokenizer: Split(Regex) patterns in order, then ByteLevel (its own GPT-2
  // regex when use_regex; add_prefix_space only without Splits before it).
  std::vector<std::string> split_patterns_;
  bool byte_level_regex_ = true;
  bool add_prefix_space_ = false;
  // Model options that change ids.
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  int32_t unk_id_ = -1;

  // Derived by build_lookup().
  std::vector<std::shared_ptr<const RegexSplitter>> splitters_;
  AddedTokens added_tokens_;
  std::unordered_map<uint64_t, int32_t> merge_rank_;  // (left << 32 | right) -> rank
  std::array<int32_t, 256> byte_id_{};                // byte -> token id, -1 if the vocab lacks it
  std::array<std::array<int32_t, 2>, 256> fallback_ids_{};   // byte -> "<0xXX>" ids of its stand-in
  std::unordered_map<std::string, int32_t> whole_piece_id_;  // ignore_merges: bytes -> id
  std::unordered_map<int32_t, uint8_t> fallback_byte_;       // "<0xXX>" id -> XX
  int32_t eot_id_ = -1, bos_id_ = -1;
};

}  // namespace pentad::data
