#include "core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace pentad {

namespace {

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  return fmt::format("{}m{:02}s", s / 60, s % 60);
}

}  // namespace

Progress::Progress(std::string label, int64_t total_bytes)
    : Progress(std::move(label), total_bytes, "") {}

Progress::Progress(std::string label, int64_t total, std::string unit)
    : label_(std::move(label)),
      total_(total),
      unit_(std::move(unit)),
      terminal_(isatty(STDERR_FILENO) == 1),
      start_(Clock::now()),
      next_(start_ + (terminal_ ? std::chrono::milliseconds(200) : std::chrono::seconds(10))) {}

Progress::~Progress() {
  finish();
}

bool Progress::due() const {
  return Clock::now() >= next_;
}

void Progress::show(int64_t done, std::string_view counts) {
  const Clock::time_point now = Clock::now();
  next_ = now + (terminal_ ? std::chrono::milliseconds(200) : std::chrono::seconds(10));
  const double seconds = std::max(std::chrono::duration<double>(now - start_).count(), 1e-9);
  std::string line =
      unit_.empty() ? fmt::format("{}: {} | {:.1f} MB/s", label_, counts, done / 1e6 / seconds)
                    : fmt::format("{}: {} | {:.0f} {}/s", label_, counts, done / seconds, unit_);
  if (total_ > 0 && done > 0) {
    const double fraction = std::min(1.0, static_cast<double>(done) / total_);
    const double eta = seconds * (1.0 - fraction) / fraction;
    line = fmt::format("{} | {:5.1f}% | ETA {}", line, 100.0 * fraction, format_duration(eta));
  }
  if (terminal_) {
    std::fprintf(stderr, "\r\033[K%s", line.c_str());  // \033[K: clear the old line's tail
    drawn_ = true;
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (!drawn_) return;
  std::fputc('\n', stderr);
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace pentad
