#pragma once
// Byte-level BPE tokenizer in the GPT-2 style, read and written as a Hugging Face
// tokenizer.json. Text is split into pieces by the GPT-2 pre-tokenization rule, each
// piece's bytes start as one token each, and merges are applied by rank within a piece.
// Special tokens ("<|endoftext|>") are never produced by encode(): callers append
// eot_id() themselves, so text that happens to contain "<|endoftext|>" stays text.
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace pentad::data {

// Splits text into GPT-2 pre-tokenization pieces; concatenating them gives the text back.
std::vector<std::string_view> pretokenize(std::string_view text);

// GPT-2's bytes_to_unicode alphabet: byte -> UTF-8 of its printable stand-in ("Ġ" for ' ').
const std::string& byte_to_unicode(uint8_t byte);

class Tokenizer {
 public:
  static constexpr const char* kEndOfText = "<|endoftext|>";

  // Learns a tokenizer: 256 byte tokens, merges until vocab_size - 1 tokens, then
  // "<|endoftext|>" as the last id. Stops early (smaller vocab) if the text runs out of
  // pairs. Deterministic: ties go to the smallest pair of ids.
  static Tokenizer train(std::string_view text, int64_t vocab_size);
  // Same, but pieces never span documents.
  static Tokenizer train(std::span<const std::string_view> documents, int64_t vocab_size);

  static Tokenizer load(const std::string& path);  // HF tokenizer.json (byte-level BPE)
  void save(const std::string& path) const;        // HF tokenizer.json, written atomically

  // Not safe to call concurrently on one Tokenizer (it fills a piece cache); use
  // encode_batch to encode many documents on every core.
  std::vector<int32_t> encode(std::string_view text) const;
  std::vector<std::vector<int32_t>> encode_batch(std::span<const std::string_view> texts) const;
  std::string decode(std::span<const int32_t> ids) const;  // throws on an id out of range

  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  int32_t eot_id() const { return eot_id_; }  // "<|endoftext|>", or -1 if absent
  int64_t num_merges() const { return static_cast<int64_t>(merges_.size()); }
  const std::string& token_bytes(int32_t id) const { return tokens_[static_cast<size_t>(id)]; }

 private:
  struct Merge {
    int32_t left, right, result;
  };
  struct PieceHash {  // lets the cache be probed with a string_view
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using PieceCache =
      std::unordered_map<std::string, std::vector<int32_t>, PieceHash, std::equal_to<>>;

  void build_lookup();  // merge ranks and byte ids from tokens_ / merges_
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_into(std::string_view text, PieceCache& cache, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;  // id -> raw bytes (special tokens: their content)
  std::vector<bool> special_;        // id -> listed in added_tokens
  std::vector<Merge> merges_;        // by rank
  std::unordered_map<uint64_t, int32_t> merge_rank_;  // (left << 32 | right) -> rank
  std::array<int32_t, 256> byte_id_{};                // byte -> token id, -1 if the vocab lacks it
  int32_t eot_id_ = -1;
  mutable PieceCache cache_;
};

}  // namespace pentad::data
