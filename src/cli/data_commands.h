#pragma once
// The `tokenizer train` and `data prepare` CLI actions, as plain functions.
#include <cstdint>
#include <string>
#include <vector>

namespace pentad::data {

// Learns a byte-level BPE tokenizer on the files' text and writes it as tokenizer.json.
void tokenizer_train(const std::vector<std::string>& text_files, int64_t vocab_size,
                     const std::string& out_json);

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or shell-style globs
  std::string tokenizer_json, out_prefix;
  bool fortune_format = false;    // plain text: documents between "%" lines, else one per file
  std::string json_key = "text";  // *.jsonl[.gz]: the field that holds the text
  std::string eod, bos;           // token contents; eod defaults to "<|endoftext|>"
  bool skip_bad = false;
  int threads = 0;  // tokenizing threads; 0: every core
  // Text per batch: one is tokenized and written on a worker while the next is read.
  size_t batch_bytes = size_t{32} << 20;
};

// Streams the inputs (JSONL, fortune or plain text, optionally gzip) through the tokenizer
// into a Megatron dataset <out_prefix>.bin/.idx: [bos] document eod, one sequence each.
// The output appears (by rename) only when every input was read.
void data_prepare(const PrepareOptions& options);

}  // namespace pentad::data
