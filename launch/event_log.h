#pragma once
// How `pentad launch` tells what it does: a line a happening on stdout (say) and, for the
// record, a JSON object a line in events.jsonl (EventLog); with the words and JSON it names a
// detection's culprit ranks by.
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace pentad::launch {

// events.jsonl: one JSON object a line, appended and flushed as it happens. Before the
// ranks have said where their out_dir is, objects wait in memory.
class EventLog {
 public:
  explicit EventLog(std::string path) { open(path); }
  // The first non-empty path wins; throws pentad::Error when it cannot be written.
  void open(const std::string& path);
  void write(const nlohmann::json& event);
  // Where the events are, for the last line of a run that gives up.
  std::string where() const;

 private:
  std::string path_;
  std::ofstream file_;
  std::vector<std::string> waiting_;
};

// "pentad launch: <line>" on stdout, flushed.
void say(const std::string& line);

// A detection's culprit ranks as words ("culprit rank 3", "culprit unknown") and as JSON (a
// rank, a list of them, or null).
std::string culprit_words(const std::vector<int>& culprit);
nlohmann::json culprit_json(const std::vector<int>& culprit);

}  // namespace pentad::launch
