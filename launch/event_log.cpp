#include "launch/event_log.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <filesystem>

#include "core/check.h"

namespace pentad::launch {

void EventLog::open(const std::string& path) {
  if (!path_.empty() || path.empty()) return;
  path_ = path;
  const auto parent = std::filesystem::path(path).parent_path();
  std::error_code ignored;
  if (!parent.empty()) std::filesystem::create_directories(parent, ignored);
  file_.open(path, std::ios::app);
  if (!file_) fail("pentad launch: cannot write the event log {} (choose one with --events)", path);
  for (const std::string& line : waiting_) file_ << line << '\n';
  waiting_.clear();
  file_.flush();
}

void EventLog::write(const nlohmann::json& event) {
  if (path_.empty()) {
    waiting_.push_back(event.dump());
    return;
  }
  file_ << event.dump() << '\n';
  file_.flush();
}

std::string EventLog::where() const {
  return path_.empty()
             ? "no event log: no rank said hello with its out_dir; --events PATH names one"
             : "events in " + path_;
}

void say(const std::string& line) {
  std::printf("pentad launch: %s\n", line.c_str());
  std::fflush(stdout);
}

std::string culprit_words(const std::vector<int>& culprit) {
  if (culprit.empty()) return "culprit unknown";
  if (culprit.size() == 1) return fmt::format("culprit rank {}", culprit[0]);
  return fmt::format("culprit ranks {}", fmt::join(culprit, ","));
}

nlohmann::json culprit_json(const std::vector<int>& culprit) {
  if (culprit.empty()) return nullptr;
  if (culprit.size() == 1) return culprit[0];
  return culprit;
}

}  // namespace pentad::launch
