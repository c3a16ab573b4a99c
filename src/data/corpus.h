#pragma once
// The default corpus: the Debian fortune-cookie database (package `fortunes`), tokenized
// on first use into a Megatron .bin/.idx pair under data.cache_dir.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/config.h"

namespace pentad::data {

class Tokenizer;

inline constexpr const char* kFortuneDir = "/usr/share/games/fortunes";

// Fortune files of `dir`, sorted: every regular file without a .dat/.u8 suffix (the
// offensive "off" sub-folder is not read).
std::vector<std::string> list_fortune_files(const std::string& dir);
// Fortune-format text -> documents: separated by lines holding just "%"; empty ones dropped.
std::vector<std::string> split_fortunes(std::string_view text);
// Reads text files as documents: fortune format splits at "%" lines, else one per file.
std::vector<std::string> read_documents(const std::vector<std::string>& files, bool fortune_format);

// Encodes every document (EOT appended when the tokenizer has one) on every core and
// writes <prefix>.bin/.idx (uint16 if the vocabulary fits, else int32). Returns tokens.
int64_t write_tokenized(const Tokenizer& tokenizer, const std::vector<std::string>& documents,
                        const std::string& prefix);

// Where the tokenized corpus lives for this recipe and vocabulary: <cache_dir>/fortunes-bpe<V>
// (learned tokenizer) or <cache_dir>/fortunes-<hash of the tokenizer file> (data.tokenizer).
std::string default_corpus_prefix(const DataConfig& cfg, int64_t vocab_size);
// The tokenizer.json that goes with it (the learned one, or data.tokenizer).
std::string default_corpus_tokenizer(const DataConfig& cfg, int64_t vocab_size);
// The tokenizer the run's tokens were encoded with: data.tokenizer, else with data.source =
// "fortunes" the learned one; "" where the recipe names none (random tokens, or token files
// prepared elsewhere without data.tokenizer). Checkpoints carry a copy of it.
std::string run_tokenizer(const DataConfig& cfg, int64_t vocab_size);

// Makes sure <prefix>.bin/.idx (and the learned tokenizer) exist, building them if not,
// and returns the prefix. Idempotent, and safe when several processes race: each writes
// temporaries named by its pid and renames them into place, and the .idx (checked to
// decide "already built") is renamed last. With MPI, rank 0 calls this first, then a
// barrier, then every rank opens the files.
std::string prepare_default_corpus(const DataConfig& cfg, int64_t vocab_size,
                                   const std::string& corpus_dir = kFortuneDir);

}  // namespace pentad::data
