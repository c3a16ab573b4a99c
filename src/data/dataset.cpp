#include "data/dataset.h"

#include <glob.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

#include "core/check.h"
#include "data/corpus.h"
#include "data/tokenizer.h"

namespace pentad::data {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

namespace {

uint64_t hash64(uint64_t x) {
  return splitmix64(x);
}

// Uniform in [0, bound) by the multiply-shift map; identical on every platform.
__extension__ typedef unsigned __int128 uint128;
uint64_t bounded(uint64_t random, uint64_t bound) {
  return static_cast<uint64_t>((static_cast<uint128>(random) * bound) >> 64);
}

std::string human_count(int64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{:.2f}B", static_cast<double>(n) / 1e9);
  if (n >= 1'000'000) return fmt::format("{:.2f}M", static_cast<double>(n) / 1e6);
  if (n >= 10'000) return fmt::format("{:.1f}k", static_cast<double>(n) / 1e3);
  return std::to_string(n);
}

template <typename T>
void decode_tokens(const uint8_t* src, int64_t count, int32_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, src + static_cast<size_t>(i) * sizeof(T), sizeof(T));
    out[i] = static_cast<int32_t>(v);
  }
}

}  // namespace

// ---- TokenStream ----

void TokenStream::add_segment(Storage& storage, const uint8_t* data, TokenDType dtype,
                              int64_t count, int32_t fill, int32_t source, int64_t source_offset) {
  if (count == 0) return;
  if (!storage.segments.empty()) {  // extend the previous segment when it continues in memory
    Segment& last = storage.segments.back();
    const bool contiguous =
        data != nullptr && last.data != nullptr && last.dtype == dtype && last.source == source &&
        last.data + static_cast<size_t>(last.count) * token_dtype_bytes(dtype) == data;
    if (contiguous) {
      last.count += count;
      storage.size += count;
      return;
    }
  }
  storage.segments.push_back({storage.size, count, data, dtype, fill, source, source_offset});
  storage.size += count;
}

TokenStream TokenStream::from_storage(std::shared_ptr<Storage> storage) {
  TokenStream stream;
  stream.size_ = storage->size;
  stream.storage_ = std::move(storage);
  return stream;
}

TokenStream TokenStream::from_tokens(std::vector<int32_t> tokens, std::string name) {
  auto storage = std::make_shared<Storage>();
  storage->memory = std::move(tokens);
  storage->names.push_back(std::move(name));
  storage->kind = "int32";
  add_segment(*storage, reinterpret_cast<const uint8_t*>(storage->memory.data()), TokenDType::I32,
              static_cast<int64_t>(storage->memory.size()), 0, 0, 0);
  return from_storage(std::move(storage));
}

TokenStream TokenStream::from_megatron(const MegatronDataset& dataset, int32_t eot) {
  auto storage = std::make_shared<Storage>();
  storage->files.push_back(dataset.bin_file());
  storage->names.push_back(dataset.bin_path());
  storage->kind = token_dtype_name(dataset.dtype());
  const auto docs = dataset.document_indices();
  int64_t file_offset = 0;  // tokens of the file seen so far, for messages
  for (size_t d = 0; d + 1 < docs.size(); ++d) {
    int64_t last_token = -1;
    for (int64_t s = docs[d]; s < docs[d + 1]; ++s) {
      const int64_t n = dataset.sequence_length(s);
      const uint8_t* data = dataset.bin_data() + dataset.sequence_pointer(s);
      add_segment(*storage, data, dataset.dtype(), n, 0, 0, file_offset);
      if (n > 0) last_token = read_token(data, dataset.dtype(), n - 1);
      file_offset += n;
    }
    if (eot >= 0 && last_token != eot)
      add_segment(*storage, nullptr, TokenDType::I32, 1, eot, 0, file_offset);
  }
  return from_storage(std::move(storage));
}

TokenStream TokenStream::from_llmc(const std::vector<LlmcShard>& shards) {
  auto storage = std::make_shared<Storage>();
  for (const LlmcShard& shard : shards) {
    const auto source = static_cast<int32_t>(storage->names.size());
    storage->files.push_back(shard.file());
    storage->names.push_back(shard.path());
    storage->kind = token_dtype_name(shard.dtype());
    add_segment(*storage, shard.token_data(), shard.dtype(), shard.num_tokens(), 0, source, 0);
  }
  return from_storage(std::move(storage));
}

TokenStream TokenStream::random(uint64_t seed, int64_t vocab_size, int64_t size) {
  PENTAD_CHECK(vocab_size > 0 && size >= 0, "bad random stream");
  auto storage = std::make_shared<Storage>();
  storage->random = true;
  storage->random_key = hash64(seed ^ 0x72616E646F6D21ull);
  storage->random_vocab = vocab_size;
  storage->size = size;
  storage->names.push_back("random");
  storage->kind = "random";
  return from_storage(std::move(storage));
}

int32_t TokenStream::at(int64_t i) const {
  int32_t token;
  copy(i, 1, &token);
  return token;
}

void TokenStream::copy(int64_t begin, int64_t count, int32_t* out) const {
  PENTAD_CHECK(begin >= 0 && count >= 0 && begin + count <= size_,
               "token range [{}, {}) outside a stream of {}", begin, begin + count, size_);
  if (count == 0) return;
  const Storage& st = *storage_;
  int64_t pos = begin_ + begin;
  if (st.random) {
    for (int64_t k = 0; k < count; ++k) {
      out[k] = static_cast<int32_t>(hash64(st.random_key ^ static_cast<uint64_t>(pos + k)) %
                                    static_cast<uint64_t>(st.random_vocab));
    }
    return;
  }
  auto it = std::upper_bound(st.segments.begin(), st.segments.end(), pos,
                             [](int64_t p, const Segment& s) { return p < s.start; });
  --it;
  while (count > 0) {
    const Segment& seg = *it++;
    const int64_t offset = pos - seg.start;
    const int64_t n = std::min(count, seg.count - offset);
    if (seg.data == nullptr) {
      std::fill(out, out + n, seg.fill);
    } else {
      const uint8_t* src = seg.data + static_cast<size_t>(offset) * token_dtype_bytes(seg.dtype);
      switch (seg.dtype) {
        case TokenDType::U8:
          decode_tokens<uint8_t>(src, n, out);
          break;
        case TokenDType::I8:
          decode_tokens<int8_t>(src, n, out);
          break;
        case TokenDType::I16:
          decode_tokens<int16_t>(src, n, out);
          break;
        case TokenDType::U16:
          decode_tokens<uint16_t>(src, n, out);
          break;
        case TokenDType::I32:
          std::memcpy(out, src, static_cast<size_t>(n) * 4);
          break;
        case TokenDType::I64:
          decode_tokens<int64_t>(src, n, out);
          break;
      }
    }
    out += n;
    pos += n;
    count -= n;
  }
}

TokenStream TokenStream::slice(int64_t begin, int64_t end) const {
  PENTAD_CHECK(0 <= begin && begin <= end && end <= size_, "slice [{}, {}) of a stream of {}",
               begin, end, size_);
  TokenStream out = *this;
  out.begin_ = begin_ + begin;
  out.size_ = end - begin;
  return out;
}

void TokenStream::check_vocab(int64_t vocab_size) const {
  if (storage_ == nullptr || storage_->random) return;
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (size_ + kChunk - 1) / kChunk;
  int64_t first_bad_chunk = chunks;
#pragma omp parallel for schedule(static) reduction(min : first_bad_chunk)
  for (int64_t c = 0; c < chunks; ++c) {
    std::vector<int32_t> buffer(static_cast<size_t>(kChunk));
    const int64_t n = std::min(kChunk, size_ - c * kChunk);
    copy(c * kChunk, n, buffer.data());
    for (int64_t i = 0; i < n; ++i) {
      if (buffer[static_cast<size_t>(i)] < 0 || buffer[static_cast<size_t>(i)] >= vocab_size) {
        first_bad_chunk = std::min(first_bad_chunk, c);
        break;
      }
    }
  }
  if (first_bad_chunk == chunks) return;
  for (int64_t i = first_bad_chunk * kChunk; i < size_; ++i) {  // locate it for the message
    const int32_t t = at(i);
    if (t >= 0 && t < vocab_size) continue;
    const int64_t pos = begin_ + i;
    auto it = std::upper_bound(storage_->segments.begin(), storage_->segments.end(), pos,
                               [](int64_t p, const Segment& s) { return p < s.start; }) -
              1;
    fail(
        "{}: token id {} at token {} is outside the model's vocabulary [0, {}); the data was "
        "tokenized with a "
        "different tokenizer, or model.vocab_size is too small",
        storage_->names[static_cast<size_t>(it->source)], t, it->source_offset + (pos - it->start),
        vocab_size);
  }
}

std::string TokenStream::describe() const {
  if (storage_ == nullptr) return "empty";
  const Storage& st = *storage_;
  std::string where = st.names.empty() ? "" : st.names.front();
  if (st.names.size() > 1) where += fmt::format(" and {} more", st.names.size() - 1);
  return fmt::format("{} ({}, {} tokens)", where, st.kind, human_count(size_));
}

// ---- DataLoader ----

struct DataLoader::PermutationCache {
  std::mutex mutex;
  int64_t epoch = -1;
  std::shared_ptr<const std::vector<int64_t>> permutation;
};

DataLoader::DataLoader(TokenStream train, TokenStream val, int64_t seq_len, uint64_t seed,
                       bool shuffle, std::string description)
    : train_(std::move(train)),
      val_(std::move(val)),
      seq_len_(seq_len),
      seed_(seed),
      shuffle_(shuffle),
      description_(std::move(description)),
      cache_(std::make_shared<PermutationCache>()) {
  if (seq_len <= 0) fail("seq_len must be positive, got {}", seq_len);
  train_windows_ = train_.size() > 0 ? (train_.size() - 1) / seq_len : 0;
  val_windows_ = val_.size() > 0 ? (val_.size() - 1) / seq_len : 0;
  if (train_windows_ < 1) {
    fail("training data has {} tokens, fewer than one sample (seq_len + 1 = {} tokens): {}",
         train_.size(), seq_len + 1, train_.describe());
  }
}

std::shared_ptr<const std::vector<int64_t>> DataLoader::permutation(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(cache_->mutex);
  if (cache_->epoch != epoch) {
    auto perm = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(train_windows_));
    for (int64_t i = 0; i < train_windows_; ++i) (*perm)[static_cast<size_t>(i)] = i;
    uint64_t state = hash64(seed_) ^ hash64(0x65706F6368ull + static_cast<uint64_t>(epoch));
    for (int64_t i = train_windows_ - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(bounded(splitmix64(state), static_cast<uint64_t>(i + 1)));
      std::swap((*perm)[static_cast<size_t>(i)], (*perm)[static_cast<size_t>(j)]);
    }
    cache_->permutation = std::move(perm);
    cache_->epoch = epoch;
  }
  return cache_->permutation;
}

int64_t DataLoader::train_window(int64_t g) const {
  PENTAD_CHECK(g >= 0, "negative sample index {}", g);
  if (!shuffle_) return g % train_windows_;
  return (*permutation(g / train_windows_))[static_cast<size_t>(g % train_windows_)];
}

void DataLoader::train_samples(int64_t first, int64_t count, int32_t* inputs,
                               int32_t* targets) const {
  PENTAD_CHECK(first >= 0 && count >= 0, "bad sample range first={} count={}", first, count);
  std::shared_ptr<const std::vector<int64_t>> perm;
  int64_t perm_epoch = -1;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t g = first + k;
    int64_t window = g % train_windows_;
    if (shuffle_) {
      const int64_t epoch = g / train_windows_;
      if (epoch != perm_epoch) {
        perm = permutation(epoch);
        perm_epoch = epoch;
      }
      window = (*perm)[static_cast<size_t>(window)];
    }
    train_.copy(window * seq_len_, seq_len_, inputs + k * seq_len_);
    train_.copy(window * seq_len_ + 1, seq_len_, targets + k * seq_len_);
  }
}

void DataLoader::val_samples(int64_t first, int64_t count, int32_t* inputs,
                             int32_t* targets) const {
  PENTAD_CHECK(first >= 0 && count >= 0, "bad sample range first={} count={}", first, count);
  if (val_windows_ < 1)
    fail("no validation data: {}", val_.size() == 0
                                       ? "val_fraction is 0 and no val_path is set"
                                       : "validation stream is shorter than one sample");
  for (int64_t k = 0; k < count; ++k) {
    const int64_t window = (first + k) % val_windows_;
    val_.copy(window * seq_len_, seq_len_, inputs + k * seq_len_);
    val_.copy(window * seq_len_ + 1, seq_len_, targets + k * seq_len_);
  }
}

std::string DataLoader::describe() const {
  return fmt::format("{}train {} tokens = {} samples of {}, val {} tokens = {} samples{}",
                     description_.empty() ? "" : description_ + "; ", human_count(train_tokens()),
                     human_count(train_windows_), seq_len_, human_count(val_tokens()),
                     human_count(val_windows_), shuffle_ ? "" : " (in order)");
}

// ---- opening the recipe's sources ----

namespace {

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  std::sort(paths.begin(), paths.end());
  return paths;
}

// Opens one file source ("megatron"/"tokens": prefix; "llmc": file or glob).
TokenStream open_files(const std::string& source, const std::string& path, int32_t eot,
                       const char* key) {
  if (path.empty()) fail("data.{} is empty; source = \"{}\" needs a path", key, source);
  if (source == "megatron" || source == "tokens" || source == "fortunes") {
    return TokenStream::from_megatron(MegatronDataset::open(path), eot);
  }
  std::vector<std::string> files = expand_glob(path);
  if (files.empty()) fail("{}: no llm.c shard matches data.{}", path, key);
  std::vector<LlmcShard> shards;
  for (const auto& f : files) shards.push_back(LlmcShard::open(f));
  return TokenStream::from_llmc(shards);
}

}  // namespace

DataLoader DataLoader::open(const DataConfig& cfg, int64_t seq_len, int64_t vocab_size,
                            uint64_t seed) {
  if (seq_len <= 0) fail("seq_len must be positive, got {}", seq_len);
  if (vocab_size <= 0) fail("vocab_size must be positive, got {}", vocab_size);
  if (!(cfg.val_fraction >= 0.0f && cfg.val_fraction < 1.0f)) {
    fail("data.val_fraction must be in [0, 1), got {}", cfg.val_fraction);
  }
  const std::string& source = cfg.source;
  if (source == "none")
    fail(
        "data.source = \"none\": this recipe names no training data (ckpt convert --from hf "
        "writes it so, rather than train an imported model on the fortune corpus); set "
        "data.source and data.path, e.g. data.source=megatron data.path=PREFIX with PREFIX from "
        "`pentad data prepare FILES --tokenizer {} -o PREFIX`",
        cfg.tokenizer.empty() ? "TOKENIZER" : cfg.tokenizer);
  if (source == "random") {
    const int64_t val_size = std::max<int64_t>(1 << 20, 16 * (seq_len + 1));
    return DataLoader(TokenStream::random(seed, vocab_size, int64_t{1} << 40),
                      TokenStream::random(hash64(seed) ^ 0x76616Cull, vocab_size, val_size),
                      seq_len, seed,
                      /*shuffle=*/false, "random tokens");
  }
  if (source != "fortunes" && source != "megatron" && source != "tokens" && source != "llmc") {
    fail(
        "data.source = \"{}\" is unknown; use \"fortunes\", \"megatron\", \"llmc\", \"tokens\" or "
        "\"random\"",
        source);
  }

  std::string path = cfg.path;
  int32_t eot = -1;  // fortunes files carry their EOTs already
  if (source == "fortunes") {
    path = prepare_default_corpus(cfg, vocab_size);
  } else if (!cfg.tokenizer.empty()) {
    eot = Tokenizer::load(cfg.tokenizer).eot_id();
  }
  TokenStream all = open_files(source, path, eot, "path");
  all.check_vocab(vocab_size);

  TokenStream train, val;
  if (!cfg.val_path.empty()) {
    train = all;
    val = open_files(source == "fortunes" ? "megatron" : source, cfg.val_path, eot, "val_path");
    val.check_vocab(vocab_size);
    if ((val.size() - 1) / seq_len < 1) {
      fail("{}: validation data has {} tokens, fewer than one sample (seq_len + 1 = {})",
           cfg.val_path, val.size(), seq_len + 1);
    }
  } else if (cfg.val_fraction > 0.0f) {
    // Train keeps windows [0, k) = tokens [0, k*S]; validation starts after them (so it
    // has one window fewer than the windows - k left over; hence at least 2 of those).
    const int64_t windows = all.size() > 0 ? (all.size() - 1) / seq_len : 0;
    const int64_t tail =
        std::max<int64_t>(2, std::llround(static_cast<double>(windows) * cfg.val_fraction));
    const int64_t k = windows - tail;
    if (k < 1) {
      fail(
          "{}: {} tokens make {} samples of seq_len {}: too few to split into training and "
          "validation (need 3); "
          "use more data, a shorter seq_len, or set data.val_path",
          path, all.size(), windows, seq_len);
    }
    train = all.slice(0, k * seq_len + 1);
    val = all.slice(k * seq_len + 1, all.size());
  } else {
    train = all;
  }
  return DataLoader(std::move(train), std::move(val), seq_len, seed, true,
                    fmt::format("{}: {}", source, all.describe()));
}

}  // namespace pentad::data
