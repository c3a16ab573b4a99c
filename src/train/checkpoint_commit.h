#pragma once
// The commit of the trainer's checkpoints. Once every rank's file of a save is written, rank 0
// commits each level (train.ckpt_dir, train.ckpt_mirror) on its own (manifest, renames,
// fsyncs) on a thread of its own, so that the training thread never waits for the file
// system; the ranks agree on the outcome at the next commit_pending() (a step later at the
// earliest). The time either takes on the training thread counts as blocked. A level whose
// saves failed train.max_failed_saves times in a row stops the run (SavesFailed), unless its
// newest committed checkpoint still stands and the first failure in the row was under
// train.failed_save_grace_s ago.
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/saver.h"
#include "parallel/comm.h"
#include "recipe/config.h"

namespace pentad {

// The run stops because checkpoint saves at `root` (a level: train.ckpt_dir or the mirror)
// failed past train.max_failed_saves and train.failed_save_grace_s. `pentad launch` checks
// that directory (its free space, whether it is there) before it restarts the job.
struct SavesFailed : Error {
  SavesFailed(const std::string& message, std::string where)
      : Error(message), root(std::move(where)) {}
  std::string root;
};

class CheckpointCommitter {
 public:
  // What rank 0's commit of a step records: the manifest's fields (base) and the tokenizer's
  // bytes each level's checkpoint carries (null: none).
  struct Record {
    ckpt::Manifest base;
    std::shared_ptr<const std::string> tokenizer;
  };
  using Describe = std::function<Record(int64_t step)>;
  // Once a save's files are written on every rank: its step and the saver's timings.
  using FilesWritten = std::function<void(int64_t step, const ckpt::AsyncSaver::Timings&)>;
  // world: every rank (null on one rank). roots: the levels, the local one first.
  CheckpointCommitter(ckpt::AsyncSaver& saver, parallel::Communicator* world, int world_rank,
                      const TrainConfig& train, std::vector<std::string> roots, Describe describe,
                      FilesWritten files_written);
  CheckpointCommitter(const CheckpointCommitter&) = delete;
  CheckpointCommitter& operator=(const CheckpointCommitter&) = delete;

  // save() has started the snapshot of `step` on every rank.
  void pending(int64_t step) { pending_save_ = step; }
  // Makes the newest snapshot a committed checkpoint once every rank has written its file
  // (block: waits for that and for the commit). Collective.
  void commit_pending(bool block);
  // The training thread's seconds in commit_pending(), less the saver's waits.
  double seconds() const { return seconds_; }

 private:
  struct Outcome {  // rank 0's commit thread: each level's commit error, what retention retired
    std::vector<std::string> errors;
    std::vector<std::string> retired;
  };
  struct Job {  // a commit in flight: each level's file error agreed by the ranks (empty: done)
    int64_t step = -1;
    std::vector<std::string> file_errors;
    std::future<Outcome> outcome;
  };
  // start() hands the pending save to the commit thread once every file is written (block:
  // waits for that); conclude() waits for the commit in flight, if any, and takes its
  // outcome (the ranks agree on it), throwing SavesFailed where a level's failures went past
  // what is tolerated.
  void start(bool block);
  void conclude();
  void stop_if_failing(const std::vector<std::string>& why,
                       std::chrono::steady_clock::time_point now);
  // Rank 0, on the commit's thread: writes each level's manifest (base) and renames the
  // partial directory into place; a level whose file failed (or whose commit throws) has its
  // partial directory removed instead.
  static Outcome commit_levels(const std::vector<std::string>& roots, const ckpt::Manifest& base,
                               int keep_last, const std::vector<std::string>& file_errors,
                               std::shared_ptr<const std::string> tokenizer);
  int all_ranks(int value, parallel::ReduceOp op);

  ckpt::AsyncSaver& saver_;
  parallel::Communicator* const world_;
  const int world_rank_;
  const TrainConfig& train_;
  const std::vector<std::string> roots_;
  const Describe describe_;
  const FilesWritten files_written_;
  int64_t pending_save_ = -1;      // step of the snapshot not yet committed
  std::optional<Job> committing_;  // its files are written; its commit is in flight
  double seconds_ = 0;
  std::vector<int64_t> failed_saves_;  // per level: failures in a row
  std::vector<std::chrono::steady_clock::time_point> first_failed_at_;  // ... the first's time
  std::vector<int64_t> committed_step_;  // per level: the newest step committed (-1: none)
};

}  // namespace pentad
