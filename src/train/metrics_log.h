#pragma once
// The run's metrics log: <out_dir>/metrics.jsonl (one JSON object a line) and, with
// train.tensorboard, the same scalars at the same steps as TensorBoard event files in
// <out_dir>/tensorboard/. World rank 0 writes both, and flushes both after every row.
#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "core/tfevents.h"

namespace pentad {

// One row's scalars and their step. The step is the row's "step", else its "saved_step"
// (a checkpoint's timings), else `last_step` (the run's totals, written after the last step);
// neither key is a scalar of its own. Every other number is one (a bool is 0 or 1, null a
// NaN: JSON writes a non-finite loss as null), tagged with its key; nested objects and arrays
// add "/<key>" or "/<index>", where an array of objects with a "layer" (moe_layers) uses
// that layer's number: moe_layers/3/tokens_max. Strings are left out.
Scalars metric_scalars(const nlohmann::json& row, int64_t last_step, int64_t* step);

// The last step <out_dir>/metrics.jsonl holds a loss row for (0: none); -1 without the file.
int64_t last_logged_step(const std::string& out_dir);

class MetricsLog {
 public:
  // A fresh run (not resumed) starts metrics.jsonl anew and deletes the
  // event files an earlier run left in <out_dir>/tensorboard; a resumed run appends to the
  // JSONL and starts a new event file whose first event, a SessionLog START at the next
  // step, has TensorBoard drop what earlier files hold for the steps trained again.
  void open(const std::string& out_dir, bool resumed, int64_t start_step, bool tensorboard);
  void write(const nlohmann::json& row);
  bool is_open() const { return jsonl_.is_open(); }

 private:
  std::string out_dir_;
  std::ofstream jsonl_;
  std::unique_ptr<EventFileWriter> events_;
  int64_t last_step_ = 0;
};

}  // namespace pentad
