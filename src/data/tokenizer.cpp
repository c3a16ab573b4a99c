// The Tokenizer facade: picks the implementation from the file and spreads encode_batch over
// the cores, each thread with its own scratch (piece cache, regex match data).
#include "data/tokenizer.h"

#include <fstream>
#include <sstream>

#include "core/check.h"
#include "data/bpe.h"
#include "data/sentencepiece.h"

namespace pentad::data {

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(std::unique_ptr<TokenizerModel> model) : model_(std::move(model)) {}
Tokenizer::Tokenizer(const Tokenizer& other)
    : model_(other.model_ ? other.model_->clone() : nullptr) {}
Tokenizer& Tokenizer::operator=(const Tokenizer& other) {
  if (this != &other) {
    model_ = other.model_ ? other.model_->clone() : nullptr;
    scratch_.reset();
  }
  return *this;
}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

const TokenizerModel& Tokenizer::model() const {
  PENTAD_CHECK(model_ != nullptr, "Tokenizer used before load() or train()");
  return *model_;
}

Tokenizer Tokenizer::train(std::string_view text, int64_t vocab_size) {
  std::string_view one[] = {text};
  return train(std::span<const std::string_view>(one), vocab_size);
}

Tokenizer Tokenizer::train(std::span<const std::string_view> documents, int64_t vocab_size,
                           bool progress) {
  return Tokenizer(BpeModel::train(documents, vocab_size, progress));
}

Tokenizer Tokenizer::load(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("{}: cannot open tokenizer file", path);
  std::stringstream buffer;
  buffer << file.rdbuf();
  const std::string bytes = buffer.str();
  // tokenizer.json is a JSON object; a serialized SentencePiece ModelProto starts with a
  // protobuf field tag (0x0A) and a length, then another tag: never '{' after whitespace.
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) fail("{}: empty tokenizer file", path);
  if (bytes[first] == '{' || bytes[first] == '[' || bytes[first] == '"')
    return Tokenizer(BpeModel::from_json(bytes, path));  // a JSON non-object is refused there
  return Tokenizer(SentencePieceModel::from_bytes(bytes, path));
}

const char* Tokenizer::file_name_for(std::string_view bytes) {
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  const bool json = first != std::string_view::npos &&
                    (bytes[first] == '{' || bytes[first] == '[' || bytes[first] == '"');
  return json ? "tokenizer.json" : "tokenizer.model";
}

void Tokenizer::save(const std::string& path) const {
  model().save(path);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  if (!scratch_) scratch_ = model().make_scratch();
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  model().encode_into(text, allow_special, *scratch_, out);
  return out;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(std::span<const std::string_view> texts,
                                                          bool allow_special) const {
  const TokenizerModel& m = model();
  std::vector<std::vector<int32_t>> out(texts.size());
  const auto n = static_cast<int64_t>(texts.size());
  std::string error;
#pragma omp parallel
  {
    std::unique_ptr<EncodeScratch> scratch = m.make_scratch();  // no locking on the hot path
#pragma omp for schedule(dynamic, 64)
    for (int64_t i = 0; i < n; ++i) {
      try {
        m.encode_into(texts[static_cast<size_t>(i)], allow_special, *scratch,
                      out[static_cast<size_t>(i)]);
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
  return model().decode(ids);
}
std::string_view Tokenizer::kind() const {
  return model().kind();
}
int64_t Tokenizer::vocab_size() const {
  return model().vocab_size();
}
int32_t Tokenizer::eot_id() const {
  return model().eot_id();
}
int32_t Tokenizer::bos_id() const {
  return model().bos_id();
}
int32_t Tokenizer::special_id(std::string_view content) const {
  return model().special_id(content);
}
int64_t Tokenizer::num_merges() const {
  return model().num_merges();
}
const std::string& Tokenizer::token_bytes(int32_t id) const {
  return model().token_bytes(id);
}

}  // namespace pentad::data
