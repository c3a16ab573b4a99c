#pragma once
// What `pentad launch` checks of a checkpoint directory before it restarts a job, so that it
// waits for a cause to clear instead of restarting into it:
// - the directory, and the newest checkpoint the ranks committed there (or a newer one:
//   retention retires the one a lagging report names), still exist (an unmounted share takes
//   both away, and a --resume latest would start from step 0);
// - where saves failed, its file system has room for a save: as many bytes free (plus
//   those of the rank files pooled for reuse in <root>/recycled) as the newest committed
//   checkpoint there holds, which a save of the same job writes again.
#include <cstdint>
#include <string>

namespace pentad::launch {

struct StoreCheck {
  std::string blocked;  // "": a restart may go ahead; "checkpoint_dir" or "checkpoint_space"
  std::string words;    // what is in the way, for a line ("" when nothing is)
  int64_t free_bytes = -1, needed_bytes = -1;  // the file system's, a save's (-1: unknown)
  std::string mount_point, fs_type;            // of the directory (or its nearest ancestor)
};

// What a restart expects of a checkpoint directory.
struct StoreExpectation {
  int64_t committed_step = -1;    // the newest checkpoint the attempt committed there (-1: none)
  bool committed_before = false;  // an earlier attempt committed there: some checkpoint stays
  bool saves_failed = false;      // the attempt stopped because its saves there failed
};

// Whether `root` meets the expectation; nothing is expected of a directory no checkpoint
// was committed to and no save failed at (a restart starts from step 0 there anyway).
StoreCheck check_store(const std::string& root, const StoreExpectation& expect);

// The bytes the files under `dir` take on disk (allocated blocks); 0 when it is missing.
int64_t bytes_on_disk(const std::string& dir);

}  // namespace pentad::launch
