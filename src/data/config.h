#pragma once
// The [data] section of a recipe: where tokens come from and how they are split.
#include <string>

namespace pentad {

struct DataConfig {  // [data]
  // "fortunes": the Debian fortune-cookie corpus, tokenized on first use;
  // "megatron": path = prefix of a .bin/.idx pair; "llmc": path = llm.c .bin shard (or glob);
  // "tokens": path = pentad token file; "random": uniform random tokens (benchmarks).
  std::string source = "fortunes";
  std::string path;                // for megatron / llmc / tokens
  std::string val_path;            // optional separate validation file
  float val_fraction = 0.05f;      // when val_path is empty: tail of the stream
  std::string tokenizer;           // tokenizer.json path; empty = learn one (fortunes)
  std::string cache_dir = "data";  // where automatic tokenization writes
};

}  // namespace pentad
