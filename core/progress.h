#pragma once
// Progress of a long command (data prepare, tokenizer train, ckpt convert, checkpoint
// verification): on a terminal one line on stderr redrawn in place every 0.2 s; elsewhere
// (logs, pipes) a plain line every 10 s, so log files stay readable. Fraction, rate and ETA
// come from work done of a known total, in bytes (shown as MB/s) or in a unit of the
// caller's (merges/s); the caller adds its own counts (documents, tokens, shards).
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace pentad {

class Progress {
 public:
  // total_bytes 0: unknown (no fraction or ETA, only the rate).
  Progress(std::string label, int64_t total_bytes);
  // Work counted in `unit`s (the rate shows as "N unit/s"), e.g. merges of a vocabulary.
  Progress(std::string label, int64_t total, std::string unit);
  ~Progress();  // ends the in-place line
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Cheap: call it as often as you like, then format your counts only when it says so.
  bool due() const;
  void show(int64_t done, std::string_view counts);
  void finish();  // ends the in-place line (idempotent)

 private:
  using Clock = std::chrono::steady_clock;
  std::string label_;
  int64_t total_;
  std::string unit_;  // empty: bytes, shown as MB/s
  bool terminal_;
  bool drawn_ = false;
  Clock::time_point start_, next_;
};

}  // namespace pentad
