// The run's metrics log (train/metrics_log.h): metrics.jsonl and TensorBoard event files.
#include "train/metrics_log.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace pentad {
namespace {

void add_metric_scalars(const std::string& tag, const nlohmann::json& value, Scalars& out) {
  if (value.is_number() || value.is_boolean())
    out.emplace_back(tag, value.get<float>());
  else if (value.is_null())
    out.emplace_back(tag, std::numeric_limits<float>::quiet_NaN());
  else if (value.is_object())
    for (const auto& [key, item] : value.items()) add_metric_scalars(tag + "/" + key, item, out);
  else if (value.is_array())
    for (size_t i = 0; i < value.size(); ++i) {
      const nlohmann::json& item = value[i];
      if (item.is_object() && item.contains("layer") && item["layer"].is_number_integer()) {
        nlohmann::json rest = item;
        rest.erase("layer");
        add_metric_scalars(fmt::format("{}/{}", tag, item["layer"].get<int64_t>()), rest, out);
      } else {
        add_metric_scalars(fmt::format("{}/{}", tag, i), item, out);
      }
    }
}

}  // namespace

Scalars metric_scalars(const nlohmann::json& row, int64_t last_step, int64_t* step) {
  const char* step_key = row.contains("step")         ? "step"
                         : row.contains("saved_step") ? "saved_step"
                                                      : nullptr;
  *step = step_key ? row[step_key].get<int64_t>() : last_step;
  Scalars scalars;
  for (const auto& [key, value] : row.items())
    if (!step_key || key != step_key) add_metric_scalars(key, value, scalars);
  return scalars;
}

int64_t last_logged_step(const std::string& out_dir) {
  std::ifstream in(std::filesystem::path(out_dir) / "metrics.jsonl");
  if (!in) return -1;
  int64_t last = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"loss\"") == std::string::npos) continue;  // eval, saves, totals
    // A line cut short (the process killed while writing it) is not a row.
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object() && row.contains("loss") && row.contains("step") &&
        row["step"].is_number_integer())
      last = std::max(last, row["step"].get<int64_t>());
  }
  return last;
}

void MetricsLog::open(const std::string& out_dir, bool resumed, int64_t start_step,
                      bool tensorboard) {
  out_dir_ = out_dir;
  const std::filesystem::path dir(out_dir);
  std::filesystem::create_directories(dir);
  const bool fresh = !resumed;
  jsonl_.open(dir / "metrics.jsonl", fresh ? std::ios::trunc : std::ios::app);
  if (!jsonl_) fail("cannot write {}/metrics.jsonl", out_dir);
  last_step_ = start_step;
  if (!tensorboard) return;
  const std::filesystem::path events_dir = dir / "tensorboard";
  std::error_code ec;
  if (fresh && std::filesystem::is_directory(events_dir, ec))  // as the JSONL is truncated
    for (const auto& entry : std::filesystem::directory_iterator(events_dir))
      if (entry.path().filename().string().starts_with("events.out.tfevents."))
        std::filesystem::remove(entry.path());
  events_ = std::make_unique<EventFileWriter>(events_dir.string());
  if (!fresh) events_->add_session_start(start_step + 1);
}

void MetricsLog::write(const nlohmann::json& row) {
  jsonl_ << row.dump() << '\n';
  jsonl_.flush();
  if (!events_) return;
  int64_t step = 0;
  const Scalars scalars = metric_scalars(row, last_step_, &step);
  if (row.contains("step")) last_step_ = step;
  if (!scalars.empty()) events_->add_scalars(step, scalars);
}

}  // namespace pentad
