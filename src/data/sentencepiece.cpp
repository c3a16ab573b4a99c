// SentencePieceModel over libsentencepiece. Its Encode is const and keeps no state between
// calls, so threads share one processor.
#include "data/sentencepiece.h"

#include <sentencepiece_processor.h>

#include "core/check.h"
#include "data/token_files.h"

namespace pentad::data {

std::unique_ptr<SentencePieceModel> SentencePieceModel::from_bytes(const std::string& bytes,
                                                                   const std::string& path) {
  auto processor = std::make_shared<sentencepiece::SentencePieceProcessor>();
  const auto status = processor->LoadFromSerializedProto(bytes);
  if (!status.ok())
    fail(
        "{}: neither a Hugging Face tokenizer.json (a JSON object) nor a SentencePiece "
        "tokenizer.model ({})",
        path, status.ToString());
  std::unique_ptr<SentencePieceModel> model(new SentencePieceModel());
  model->path_ = path;
  model->bytes_ = bytes;
  std::vector<AddedToken> controls;
  for (int id = 0; id < processor->GetPieceSize(); ++id) {
    if (!processor->IsControl(id)) continue;
    AddedToken t;
    t.content = processor->IdToPiece(id);
    t.id = id;
    controls.push_back(t);
  }
  model->specials_ = AddedTokens(std::move(controls));
  model->processor_ = std::move(processor);
  return model;
}

SentencePieceModel::~SentencePieceModel() = default;

std::unique_ptr<TokenizerModel> SentencePieceModel::clone() const {
  return std::unique_ptr<TokenizerModel>(new SentencePieceModel(*this));
}

std::unique_ptr<EncodeScratch> SentencePieceModel::make_scratch() const {
  return std::make_unique<EncodeScratch>();
}

void SentencePieceModel::encode_into(std::string_view text, bool allow_special,
                                     EncodeScratch& /*scratch*/, std::vector<int32_t>& out) const {
  std::vector<AddedTokens::Segment> segments;
  specials_.split(text, allow_special, segments);
  std::vector<int> ids;
  for (const AddedTokens::Segment& segment : segments) {
    if (segment.id >= 0) {
      out.push_back(segment.id);
      continue;
    }
    const auto status = processor_->Encode(segment.text, &ids);
    if (!status.ok())
      fail("{}: SentencePiece could not encode the text ({})", path_, status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }
}

std::string SentencePieceModel::decode(std::span<const int32_t> ids) const {
  std::vector<int> in(ids.begin(), ids.end());
  for (int id : in)
    if (id < 0 || id >= processor_->GetPieceSize())
      fail("cannot decode token id {}: vocabulary has {} tokens", id, processor_->GetPieceSize());
  std::string text;
  const auto status = processor_->Decode(in, &text);
  if (!status.ok()) fail("{}: SentencePiece could not decode ({})", path_, status.ToString());
  return text;
}

int64_t SentencePieceModel::vocab_size() const {
  return processor_->GetPieceSize();
}
int32_t SentencePieceModel::eot_id() const {
  return processor_->eos_id();  // -1 when the model has none
}
int32_t SentencePieceModel::bos_id() const {
  return processor_->bos_id();
}

const std::string& SentencePieceModel::token_bytes(int32_t id) const {
  fail(
      "{}: token_bytes({}) has no meaning for a SentencePiece model (its pieces are "
      "normalized text, \"▁\" for a space); decode ids instead",
      path_, id);
}

void SentencePieceModel::save(const std::string& path) const {
  write_file_atomically(path, bytes_.data(), bytes_.size());
}

}  // namespace pentad::data
