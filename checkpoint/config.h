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
  // "auto": swap on the CPU, copy on CUDA (device memory is the scarcer).
  std::string snapshot = "auto";
};

}  // namespace pentad
