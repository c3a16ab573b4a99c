#pragma once
// `pentad generate CHECKPOINT --prompt TEXT`: loads a committed checkpoint of any layout into
// one process, on the CPU or a GPU (--device, --precision), encodes the prompt with the
// tokenizer the checkpoint carries (else the recipe's) and prints the continuation to stdout as
// it is produced, then a line with tokens/s to stderr (docs/generate.md).
#include <cstdint>
#include <string>

#include "model/generate.h"

namespace pentad::ckpt {

struct GenerateOptions {
  std::string checkpoint;
  std::string prompt;
  std::string prompt_ids;   // comma-separated token ids instead of text (no tokenizer needed)
  std::string tokenizer;    // overrides the checkpoint's (else the recipe's) tokenizer file
  bool ignore_eos = false;  // go on past the end-of-text token (to --max-tokens)
  int64_t max_tokens = 64;
  bool print_ids = false;          // print the generated ids, one line, instead of text
  bool no_cache = false;           // every step a full forward of the context (no key/value cache)
  std::string device = "cpu";      // or "cuda": the first visible GPU
  std::string precision = "fp32";  // or "bf16" (CUDA only): bf16 weights and activations
  SamplingOptions sampling;
};

void generate(const GenerateOptions& options);

}  // namespace pentad::ckpt
