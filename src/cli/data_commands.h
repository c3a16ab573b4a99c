#pragma once
// The `tokenizer train` and `data prepare` CLI actions, as plain functions.
#include <cstdint>
#include <string>
#include <vector>

namespace pentad::data {

// Learns a byte-level BPE tokenizer on the files' text and writes it as tokenizer.json.
void tokenizer_train(const std::vector<std::string>& text_files, int64_t vocab_size,
                     const std::string& out_json);

// Tokenizes text files into a Megatron dataset <out_prefix>.bin/.idx, EOT after each
// document. fortune_format: documents are separated by "%" lines; else one per file.
void data_prepare(const std::vector<std::string>& text_files, const std::string& tokenizer_json,
                  const std::string& out_prefix, bool fortune_format);

}  // namespace pentad::data
