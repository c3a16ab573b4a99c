#pragma once
// The [checkpoint] section of a recipe: how a save takes its snapshot of the state. (When
// and where checkpoints are written are train.save_every, train.ckpt_dir, ...)
#include <string>

namespace pentad {

struct CheckpointConfig {  // [checkpoint]
  // "swap": the optimizer step after a save writes a second set of parameters and AdamW
  // moments and training goes on with it, while the saver writes the untouched first set
  // from where it lies (no copy, nothing waits; a second set of the state in memory).
  // "copy": the lazy copy into one host staging buffer, which the optimizer follows chunk
  // by chunk (the same memory on the ranks that write, none on the others).
  // "auto": copy, for now. Swap writes the parameter arena where it lies, whose tensors do
  // not start on pages, so its file goes through the page cache, and on 2 cores that cost
  // more than the copy it saves (bench/RESULTS.md, 2026-11-24).
  std::string snapshot = "auto";
};

}  // namespace pentad
