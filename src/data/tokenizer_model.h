#pragma once
// What a tokenizer implementation gives the Tokenizer facade (tokenizer.h): byte-level BPE
// from tokenizer.json (bpe.h) or SentencePiece from tokenizer.model (sentencepiece.h).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pentad::data {

// Per-thread encoding state (caches, regex match data); each model makes its own kind.
struct EncodeScratch {
  virtual ~EncodeScratch() = default;
};

class TokenizerModel {
 public:
  virtual ~TokenizerModel() = default;
  virtual std::unique_ptr<TokenizerModel> clone() const = 0;
  virtual std::string_view kind() const = 0;  // for messages: "byte-level BPE", ...

  virtual std::unique_ptr<EncodeScratch> make_scratch() const = 0;
  // Appends the ids of `text`; safe to call from many threads, each with its own scratch.
  virtual void encode_into(std::string_view text, bool allow_special, EncodeScratch& scratch,
                           std::vector<int32_t>& out) const = 0;
  virtual std::string decode(std::span<const int32_t> ids) const = 0;

  virtual int64_t vocab_size() const = 0;
  virtual int32_t special_id(std::string_view content) const = 0;  // -1 if absent
  virtual int32_t eot_id() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int64_t num_merges() const { return 0; }
  virtual const std::string& token_bytes(int32_t id) const = 0;
  virtual void save(const std::string& path) const = 0;
};

}  // namespace pentad::data
