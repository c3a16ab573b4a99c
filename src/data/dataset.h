#pragma once
// Token streams and the sampler that cuts them into training samples.
//
// Sample order (the contract a data-parallel run relies on): the training stream is cut
// into non-overlapping windows, window j = tokens [j*S, j*S + S + 1) for S = seq_len
// (inputs are the first S tokens, targets the last S). Global sample g belongs to epoch
// e = g / n_windows and reads window perm_e[g % n_windows], where perm_e is a
// Fisher-Yates shuffle driven by splitmix64 seeded from (seed, e). The order depends only
// on (data, seq_len, seed), never on how callers split [first, first + count) ranges, so a
// rank asks for its own slice of the global indices and gets the same samples as one rank.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/config.h"
#include "data/token_files.h"

namespace pentad::data {

uint64_t splitmix64(uint64_t& state);  // the portable PRNG behind every shuffle here

// A flat, read-only view of tokens: the concatenation of a source's documents (each
// followed by EOT where the source has documents and the EOT id is known), backed by
// mmap'd files, memory, or a hash (random). Copies share the underlying storage.
class TokenStream {
 public:
  TokenStream() = default;
  static TokenStream from_tokens(std::vector<int32_t> tokens, std::string name = "memory");
  // Each document followed by `eot` unless it already ends with it; eot < 0: no separator.
  static TokenStream from_megatron(const MegatronDataset& dataset, int32_t eot);
  static TokenStream from_llmc(const std::vector<LlmcShard>& shards);  // shards back to back
  // Token i = hash(seed, i) % vocab_size: benchmark data with no files.
  static TokenStream random(uint64_t seed, int64_t vocab_size, int64_t size);

  int64_t size() const { return size_; }
  int32_t at(int64_t i) const;
  void copy(int64_t begin, int64_t count, int32_t* out) const;  // tokens [begin, begin + count)
  TokenStream slice(int64_t begin, int64_t end) const;          // tokens [begin, end)
  // Every token must lie in [0, vocab_size); the error names the file and position.
  void check_vocab(int64_t vocab_size) const;
  std::string describe() const;  // "data/x.bin (uint16, 1.2M tokens)"

 private:
  struct Segment {
    int64_t start = 0;  // position in the whole stream
    int64_t count = 0;
    const uint8_t* data = nullptr;  // nullptr: the token `fill`, `count` times
    TokenDType dtype = TokenDType::I32;
    int32_t fill = 0;
    int32_t source = 0;         // index into Storage::names
    int64_t source_offset = 0;  // token index within that source, for messages
  };
  struct Storage {
    std::vector<std::shared_ptr<const MappedFile>> files;
    std::vector<int32_t> memory;
    std::vector<Segment> segments;  // sorted by start, contiguous
    std::vector<std::string> names;
    std::string kind;  // "uint16", "int32", "random", ...
    bool random = false;
    uint64_t random_key = 0;
    int64_t random_vocab = 0;
    int64_t size = 0;
  };
  static TokenStream from_storage(std::shared_ptr<Storage> storage);
  static void add_segment(Storage& storage, const uint8_t* data, TokenDType dtype, int64_t count,
                          int32_t fill, int32_t source, int64_t source_offset);

  std::shared_ptr<const Storage> storage_;
  int64_t begin_ = 0, size_ = 0;
};

class DataLoader {
 public:
  // Opens train + validation streams for the recipe's [data] section. seq_len = tokens per
  // sample; vocab_size = the model's vocabulary (every token id must be < vocab_size).
  static DataLoader open(const DataConfig& cfg, int64_t seq_len, int64_t vocab_size, uint64_t seed);
  // From streams directly (tests, tools). shuffle = false keeps windows in order.
  DataLoader(TokenStream train, TokenStream val, int64_t seq_len, uint64_t seed,
             bool shuffle = true, std::string description = "");

  // Writes `count` samples starting at global sample index `first` of the training order:
  // inputs and targets, each (count, seq_len) int32, targets = inputs shifted by one.
  void train_samples(int64_t first, int64_t count, int32_t* inputs, int32_t* targets) const;
  // Validation: windows in stream order, no shuffle; sample i reads window i % val_windows.
  void val_samples(int64_t first, int64_t count, int32_t* inputs, int32_t* targets) const;

  int64_t train_tokens() const { return train_.size(); }
  int64_t val_tokens() const { return val_.size(); }
  int64_t train_windows() const { return train_windows_; }  // samples per epoch
  int64_t val_windows() const { return val_windows_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t train_window(int64_t g) const;  // the window global sample g reads
  std::string describe() const;

 private:
  struct PermutationCache;
  std::shared_ptr<const std::vector<int64_t>> permutation(int64_t epoch) const;

  TokenStream train_, val_;
  int64_t seq_len_ = 0;
  uint64_t seed_ = 0;
  bool shuffle_ = true;
  int64_t train_windows_ = 0, val_windows_ = 0;
  std::string description_;
  std::shared_ptr<PermutationCache> cache_;  // last epoch's permutation, behind a mutex
};

}  // namespace pentad::data
