#pragma once
// SentencePiece models (LLaMA-2's and Mistral's tokenizer.model) through Debian's
// libsentencepiece: the library normalizes and encodes, so ids are the sentencepiece
// package's. Control symbols (<s>, </s>) are special tokens: cut out of the text only when
// the caller allows them, else the library reads them as text.
#include <memory>
#include <string>

#include "data/added_tokens.h"
#include "data/tokenizer_model.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace pentad::data {

class SentencePieceModel final : public TokenizerModel {
 public:
  // `bytes`: the serialized ModelProto (the file's contents); `path` for messages.
  static std::unique_ptr<SentencePieceModel> from_bytes(const std::string& bytes,
                                                        const std::string& path);
  ~SentencePieceModel() override;

  std::unique_ptr<TokenizerModel> clone() const override;
  std::string_view kind() const override { return "SentencePiece"; }
  std::unique_ptr<EncodeScratch> make_scratch() const override;
  void encode_into(std::string_view text, bool allow_special, EncodeScratch& scratch,
                   std::vector<int32_t>& out) const override;
  std::string decode(std::span<const int32_t> ids) const override;

  int64_t vocab_size() const override;
  int32_t special_id(std::string_view content) const override { return specials_.id_of(content); }
  int32_t eot_id() const override;
  int32_t bos_id() const override;
  const std::string& token_bytes(int32_t id) const override;
  void save(const std::string& path) const override;  // writes the model file back

 private:
  SentencePieceModel() = default;

  std::string path_, bytes_;
  std::shared_ptr<const sentencepiece::SentencePieceProcessor> processor_;  // immutable
  AddedTokens specials_;                                                    // the control symbols
};

}  // namespace pentad::data
