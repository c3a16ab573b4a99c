#include "cli/data_commands.h"

#include <fmt/format.h>

#include <chrono>

#include "core/check.h"
#include "data/corpus.h"
#include "data/tokenizer.h"

namespace pentad::data {

void tokenizer_train(const std::vector<std::string>& text_files, int64_t vocab_size,
                     const std::string& out_json) {
  if (text_files.empty()) fail("tokenizer train: no text files given");
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> docs = read_documents(text_files, /*fortune_format=*/false);
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  std::vector<std::string_view> views(docs.begin(), docs.end());
  const Tokenizer tokenizer = Tokenizer::train(views, vocab_size);
  tokenizer.save(out_json);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("tokenizer train: {} files, {} bytes -> {} tokens ({} merges), wrote {} in {:.1f} s\n",
             text_files.size(), bytes, tokenizer.vocab_size(), tokenizer.num_merges(), out_json,
             seconds);
}

void data_prepare(const std::vector<std::string>& text_files, const std::string& tokenizer_json,
                  const std::string& out_prefix, bool fortune_format) {
  if (text_files.empty()) fail("data prepare: no text files given");
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_json);
  const std::vector<std::string> docs = read_documents(text_files, fortune_format);
  if (docs.empty()) fail("data prepare: the {} files hold no documents", text_files.size());
  const int64_t tokens = write_tokenized(tokenizer, docs, out_prefix);
  fmt::print("data prepare: {} documents, {} tokens -> {}.bin, {}.idx\n", docs.size(), tokens,
             out_prefix, out_prefix);
}

}  // namespace pentad::data
