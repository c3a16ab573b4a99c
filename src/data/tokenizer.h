#pragma once
// The tokenizer every caller uses: a facade over byte-level BPE (Hugging Face
// tokenizer.json, GPT-2 and LLaMA-3 style: bpe.h) and SentencePiece (tokenizer.model:
// sentencepiece.h), chosen from the file by load(). Special tokens are produced only when
// the caller passes allow_special, and never by default: callers append eot_id() themselves,
// so text that happens to contain "<|endoftext|>" stays text. encode() never adds a BOS.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/byte_level.h"
#include "data/regex_split.h"
#include "data/tokenizer_model.h"

namespace pentad::data {

class Tokenizer {
 public:
  static constexpr const char* kEndOfText = "<|endoftext|>";

  // Learns a byte-level BPE: 256 byte tokens, merges until vocab_size - 1 tokens, then
  // "<|endoftext|>" as the last id. Stops early (smaller vocab) if the text runs out of
  // pairs. Deterministic: ties go to the smallest pair of ids. GPT-2's pre-tokenizer.
  static Tokenizer train(std::string_view text, int64_t vocab_size);
  // Same, but pieces never span documents. progress: a progress line on stderr while it
  // counts and merges (tokenizer train).
  static Tokenizer train(std::span<const std::string_view> documents, int64_t vocab_size,
                         bool progress = false);

  // A Hugging Face tokenizer.json (byte-level BPE) or a SentencePiece model, told apart by
  // the contents: a JSON object is the former. Errors name the file and the field.
  static Tokenizer load(const std::string& path);
  // The conventional name of a tokenizer file with these contents, told apart as load() does:
  // "tokenizer.json" (a JSON document) or "tokenizer.model" (SentencePiece).
  static const char* file_name_for(std::string_view bytes);
  void save(const std::string& path) const;  // written atomically, in the format it came in

  Tokenizer();
  Tokenizer(const Tokenizer& other);
  Tokenizer& operator=(const Tokenizer& other);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Not safe to call concurrently on one Tokenizer (it fills a piece cache); use
  // encode_batch to encode many documents on every core.
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const;
  std::vector<std::vector<int32_t>> encode_batch(std::span<const std::string_view> texts,
                                                 bool allow_special = false) const;
  std::string decode(std::span<const int32_t> ids) const;  // throws on an id out of range

  std::string_view kind() const;  // "byte-level BPE" or "SentencePiece"
  int64_t vocab_size() const;
  int32_t eot_id() const;  // <|endoftext|>, <|end_of_text|> or </s>; -1 if absent
  int32_t bos_id() const;  // <|begin_of_text|> or <s>; -1 if absent
  // The id of a special token by its text ("<|eot_id|>"), -1 if the vocabulary has none.
  int32_t special_id(std::string_view content) const;
  int64_t num_merges() const;  // BPE merges; 0 for SentencePiece
  // The raw bytes of a BPE token (special tokens: their text); SentencePiece refuses.
  const std::string& token_bytes(int32_t id) const;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerModel> model);
  const TokenizerModel& model() const;

  std::unique_ptr<TokenizerModel> model_;
  mutable std::unique_ptr<EncodeScratch> scratch_;  // encode()'s, made on first use
};

}  // namespace pentad::data
