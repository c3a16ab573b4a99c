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
  // "auto": copy, for now: swap measured equal to it within noise (bench/RESULTS.md,
  // 2026-11-25) and costs a second set of the state.
  std::string snapshot = "auto";
  // A checkpoint that train.keep_last retires leaves its rank files in <ckpt_dir>/recycled
  // and the next save of each rank writes over its file there, instead of having its old
  // blocks freed and new ones allocated (ext4: half the write time, and no deletion).
  // The folder goes at the end of the run.
  bool recycle_files = true;
  // On SIGTERM (mpirun ending the ranks after one died, pentad launch ending a job) each rank
  // writes its live state, its replicas' copies too, into <ckpt_dir>/step-<N>.survivors.<job>;
  // --resume latest adopts it as a checkpoint where the ranks' files hold all of it (every
  // shard had a replica that lived), so the restart redoes no step (train/survivor_save.h).
  bool survivors = true;
  // The in-memory level (checkpoint/memory_level.h): every memory_every steps between the
  // checkpoint files (0: none), each rank snapshots its state into host memory that outlives
  // the process, two files in memory_dir (a tmpfs); --resume latest takes the newest such
  // snapshot where it is newer than the newest checkpoint file and the layout is the same.
  int64_t memory_every = 0;
  std::string memory_dir = "/dev/shm";
};

}  // namespace pentad
