// Learning BPE merges. Pieces of the text are counted once ("words" with counts); pair
// counts live in a table with, for each pair, the words that contain it, so a merge only
// revisits the words it changes. A lazy max-heap picks the next pair: entries whose count
// is out of date are skipped when popped.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <queue>
#include <string>
#include <unordered_map>

#include "core/check.h"
#include "core/progress.h"
#include "data/bpe.h"

namespace pentad::data {

namespace {

struct Word {
  std::vector<int32_t> symbols;
  int64_t count = 0;
};

uint64_t key_of(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct Candidate {
  int64_t count;
  uint64_t pair;
  // Max-heap order: highest count first, then the smallest (left, right) ids.
  bool operator<(const Candidate& other) const {
    if (count != other.count) return count < other.count;
    return pair > other.pair;
  }
};

// How often each pre-tokenized piece occurs in the documents.
std::unordered_map<std::string_view, int64_t> count_pieces(
    std::span<const std::string_view> documents, bool progress) {
  std::unordered_map<std::string_view, int64_t> piece_counts;
  int64_t total = 0, done = 0, docs = 0;
  for (std::string_view doc : documents) total += static_cast<int64_t>(doc.size());
  std::optional<Progress> counting;
  if (progress) counting.emplace("tokenizer train: counting pieces", total);
  for (std::string_view doc : documents) {
    for (std::string_view piece : pretokenize(doc)) ++piece_counts[piece];
    done += static_cast<int64_t>(doc.size());
    ++docs;
    if (counting && counting->due())
      counting->show(done,
                     fmt::format("{} documents, {} distinct pieces", docs, piece_counts.size()));
  }
  return piece_counts;
}

// The pieces as words of byte symbols, sorted so that word indices (and with them every later
// step) are deterministic.
std::vector<Word> words_of(const std::unordered_map<std::string_view, int64_t>& piece_counts) {
  std::vector<std::pair<std::string_view, int64_t>> sorted(piece_counts.begin(),
                                                           piece_counts.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<Word> words(sorted.size());
  for (size_t w = 0; w < sorted.size(); ++w) {
    for (char c : sorted[w].first) words[w].symbols.push_back(static_cast<uint8_t>(c));
    words[w].count = sorted[w].second;
  }
  return words;
}

// Every adjacent pair's count over all words, the words that contain it, and the lazy heap
// that picks the next merge.
class PairTable {
 public:
  explicit PairTable(const std::vector<Word>& words) {
    for (size_t w = 0; w < words.size(); ++w) {
      const auto& s = words[w].symbols;
      for (size_t k = 0; k + 1 < s.size(); ++k) {
        uint64_t p = key_of(s[k], s[k + 1]);
        count_[p] += words[w].count;
        auto& list = words_with_[p];
        if (list.empty() || list.back() != static_cast<int32_t>(w))
          list.push_back(static_cast<int32_t>(w));
      }
    }
    for (const auto& [p, c] : count_) heap_.push({c, p});
  }

  bool empty() const { return heap_.empty(); }
  // The heap's top, removed; nullopt when its count is out of date (a stale entry).
  std::optional<Candidate> pop() {
    const Candidate top = heap_.top();
    heap_.pop();
    auto found = count_.find(top.pair);
    if (found == count_.end() || found->second != top.count) return std::nullopt;
    return top;
  }

  // Replaces the pair by `merged` in every word that holds it and brings the counts, word
  // lists and heap up to date.
  void merge(uint64_t pair, int32_t merged, std::vector<Word>& words) {
    std::vector<int32_t> affected = std::move(words_with_[pair]);
    words_with_.erase(pair);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    delta_.clear();
    const auto left = static_cast<int32_t>(pair >> 32);
    const auto right = static_cast<int32_t>(pair & 0xFFFFFFFFu);
    for (int32_t w : affected) rewrite(w, left, right, merged, words[static_cast<size_t>(w)]);
    for (const auto& [p, d] : delta_) {
      if (d == 0) continue;
      int64_t& c = count_[p];
      c += d;
      PENTAD_CHECK(c >= 0, "negative pair count");
      if (c == 0) {
        count_.erase(p);
        words_with_.erase(p);
      } else {
        heap_.push({c, p});
      }
    }
  }

 private:
  // Word w with (left, right) replaced by `merged`, its pairs' change in count added to delta_.
  void rewrite(int32_t w, int32_t left, int32_t right, int32_t merged, Word& word) {
    auto& s = word.symbols;
    bool present = false;  // false: a stale listing, an earlier merge took the pair from w
    for (size_t k = 0; k + 1 < s.size() && !present; ++k)
      present = s[k] == left && s[k + 1] == right;
    if (!present) return;
    for (size_t k = 0; k + 1 < s.size(); ++k) delta_[key_of(s[k], s[k + 1])] -= word.count;
    size_t out = 0;
    for (size_t k = 0; k < s.size(); ++k) {
      if (k + 1 < s.size() && s[k] == left && s[k + 1] == right) {
        s[out++] = merged;
        ++k;
      } else {
        s[out++] = s[k];
      }
    }
    s.resize(out);
    for (size_t k = 0; k + 1 < s.size(); ++k) {
      uint64_t p = key_of(s[k], s[k + 1]);
      delta_[p] += word.count;
      if (s[k] == merged || s[k + 1] == merged)
        words_with_[p].push_back(w);  // other pairs already list w
    }
  }

  std::unordered_map<uint64_t, int64_t> count_;
  std::unordered_map<uint64_t, std::vector<int32_t>> words_with_;  // may hold stale/duplicates
  std::priority_queue<Candidate> heap_;
  std::unordered_map<uint64_t, int64_t> delta_;  // merge()'s change per pair, kept for reuse
};

}  // namespace

std::unique_ptr<BpeModel> BpeModel::train(std::span<const std::string_view> documents,
                                          int64_t vocab_size, bool progress) {
  if (vocab_size < 257)
    fail("tokenizer vocab_size must be at least 257 (256 bytes + <|endoftext|>), got {}",
         vocab_size);
  if (vocab_size > (int64_t{1} << 31) - 1) fail("tokenizer vocab_size {} is too large", vocab_size);
  std::vector<Word> words = words_of(count_pieces(documents, progress));

  auto owned = std::make_unique<BpeModel>();
  BpeModel& tok = *owned;
  std::unordered_map<std::string, int32_t> id_of;
  for (int b = 0; b < 256; ++b) {
    tok.tokens_.emplace_back(1, static_cast<char>(b));
    id_of.emplace(tok.tokens_.back(), b);
  }

  PairTable pairs(words);
  const auto first_merged = static_cast<int64_t>(tok.tokens_.size());  // 256: the bytes
  const int64_t merges_wanted = vocab_size - 1 - first_merged;
  std::optional<Progress> merging;
  if (progress) merging.emplace("tokenizer train: merging", merges_wanted, "merges");
  while (static_cast<int64_t>(tok.tokens_.size()) < vocab_size - 1 && !pairs.empty()) {
    if (merging && merging->due()) {
      const int64_t made = static_cast<int64_t>(tok.tokens_.size()) - first_merged;
      merging->show(made, fmt::format("{}/{} merges", made, merges_wanted));
    }
    const std::optional<Candidate> top = pairs.pop();
    if (!top) continue;
    const auto left = static_cast<int32_t>(top->pair >> 32);
    const auto right = static_cast<int32_t>(top->pair & 0xFFFFFFFFu);
    // Two merges can spell the same bytes ("a"+"bc", "ab"+"c"): they share one token,
    // as in Hugging Face's trainer, so the vocab stays a map from strings to ids.
    std::string bytes =
        tok.tokens_[static_cast<size_t>(left)] + tok.tokens_[static_cast<size_t>(right)];
    auto [existing, is_new] = id_of.emplace(bytes, static_cast<int32_t>(tok.tokens_.size()));
    const int32_t merged = existing->second;
    if (is_new) tok.tokens_.push_back(std::move(bytes));
    tok.merges_.push_back({left, right, merged});
    pairs.merge(top->pair, merged, words);
  }

  AddedToken eot;
  eot.content = "<|endoftext|>";
  eot.id = static_cast<int32_t>(tok.tokens_.size());
  eot.normalized = true;  // as GPT-2's tokenizer.json has it
  tok.tokens_.push_back(eot.content);
  tok.added_.assign(tok.tokens_.size(), false);
  tok.added_.back() = true;
  tok.added_list_.push_back(eot);
  tok.build_lookup();
  return owned;
}

}  // namespace pentad::data
