#pragma once
// Lazy asynchronous saving. At a save step the state a bitwise resume needs (parameters,
// AdamW moments; step and schedule go in the manifest) does not change until the next
// optimizer step, so begin() returns at once and a background thread copies it into host
// staging buffers while the next forward and backward compute. The optimizer calls
// wait_for_copy() before it overwrites anything; then the same thread flushes the staged
// copy to this rank's HDF5 file. Committing (every rank done, manifest, atomic rename) is
// collective and happens on the training thread: see Trainer.
//
// The staging buffers keep the newest snapshot in host memory until the next save.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace pentad::ckpt {

struct LiveTensor {
  ShardInfo info;            // global identity of the shard this rank holds
  const float* live = nullptr;  // the training state it is copied from
};

class AsyncSaver {
 public:
  AsyncSaver() = default;
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Starts a snapshot of `tensors` (empty on ranks that write nothing) into each of
  // `files` in turn: the local checkpoint first, then any further level (a shared store).
  // asynchronous = false copies and writes before returning (the synchronous peer).
  void begin(std::vector<std::string> files, std::vector<LiveTensor> tensors, bool asynchronous);
  // Blocks until the snapshot's copy is complete: call before changing the live state.
  void wait_for_copy();
  // Whether the file is written (or failed); wait_for_file() blocks until then and
  // rethrows a write failure as pentad::Error.
  bool file_done() const { return !busy_ || file_done_.load(); }
  void wait_for_file();
  bool pending() const { return busy_; }

  // Seconds the training thread spent blocked in begin(), wait_for_copy() and
  // wait_for_file(), in total.
  double blocked_seconds() const { return blocked_seconds_; }

 private:
  void run();  // the background thread: copy, then write

  std::vector<std::string> files_;
  std::vector<LiveTensor> tensors_;
  std::unique_ptr<float[]> staging_;  // every tensor's copy, back to back
  size_t staging_capacity_ = 0;       // floats
  std::thread thread_;
  bool busy_ = false;
  bool background_ = false;  // run() is on its own thread
  std::atomic<bool> copied_{false}, file_done_{false};
  std::string error_;
  double blocked_seconds_ = 0.0;
};

}  // namespace pentad::ckpt
