#pragma once
// The in-memory checkpoint level (checkpoint.memory_every): a snapshot of this rank's state
// every few steps, kept in host memory that outlives the process (files on a tmpfs such as
// /dev/shm), so that a job restarted on the same machines after a process died resumes from
// it, steps newer than the newest checkpoint file, without reading disk.
//
// Two slots, each an AsyncSaver whose staging buffer is the file <prefix>.<slot> mapped
// shared: a snapshot copies the state into the slot that does not hold the newest complete
// one, as lazily as a checkpoint's copy (the optimizer follows it chunk by chunk), and once
// the copy is whole writes the slot's index <prefix>.<slot>.json (a manifest: step, data
// position, recipe, each tensor's identity and xxh3-64 checksum) by a rename. The index of a
// slot goes before its copy starts, so a slot with an index holds the whole state of its
// step whenever the process dies: the newest complete snapshot is always there to take.
//
// What it does not survive: the machine's reboot or loss (tmpfs is memory), which the
// checkpoint files cover. It loads into the same layout only (each rank its own slot, no
// resharding); another layout resumes from the files.
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/saver.h"

namespace pentad::ckpt {

class MemoryLevel {
 public:
  // The prefix of rank `rank`'s slots for the checkpoints of `root`, in directory `dir`:
  // <dir>/pentad-<16 hex digits of root's absolute path's hash>-rank-<5 digits>.
  static std::string prefix_for(const std::string& dir, const std::string& root, int rank);

  // The prefixes (prefix_for's) of the ranks from `first_rank` on whose slot files are in
  // prefix's directory for the same checkpoints: what a job of more ranks left.
  static std::vector<std::string> prefixes_from_rank(const std::string& prefix, int first_rank);

  explicit MemoryLevel(std::string prefix);
  MemoryLevel(const MemoryLevel&) = delete;
  MemoryLevel& operator=(const MemoryLevel&) = delete;
  const std::string& prefix() const { return prefix_; }
  std::string data_file(int slot) const;
  std::string index_file(int slot) const;

  // Allocates both slots (their files) for snapshots of `tensors` now, at start-up, after
  // the resume: a slot that holds a complete snapshot is mapped as it is, the other written
  // once (its first touch), so that a restart before the first take() still finds it.
  void reserve(const std::vector<LiveTensor>& tensors);
  // Starts a snapshot of `tensors` recorded as `base` (step, optimizer steps, samples,
  // layout, recipe) into the slot that does not hold the newest complete snapshot.
  void take(const Manifest& base, std::vector<LiveTensor> tensors, bool asynchronous);
  // As AsyncSaver's, for the snapshot in flight.
  bool copying() const { return slots_[newest_].copying(); }
  void wait_for_copy(const float* begin, const float* end) {
    slots_[newest_].wait_for_copy(begin, end);
  }
  void wait_for_copy() { slots_[newest_].wait_for_copy(); }
  // Waits for every snapshot's copy and index; rethrows a failed one's error.
  void settle();
  double blocked_seconds() const {
    return slots_[0].blocked_seconds() + slots_[1].blocked_seconds();
  }
  size_t staging_bytes() const { return slots_[0].staging_bytes() + slots_[1].staging_bytes(); }

  // The complete snapshots in the slots' files (from this process or an earlier one): the
  // slot and its index, newest first. An index that does not parse is skipped.
  struct Held {
    int slot = 0;
    Manifest manifest;
  };
  std::vector<Held> held() const;
  // Whether an index lists exactly `tensors` (names, shapes, slices, in order).
  static bool holds(const Manifest& index, const std::vector<LiveTensor>& tensors);
  // Copies slot's snapshot into `tensors` (this run's, in its order): throws pentad::Error,
  // naming the file and the tensor, where the slot holds other tensors (another layout) or
  // a tensor fails its checksum; then nothing was written.
  void load(int slot, const std::vector<LiveTensor>& tensors) const;
  // After a load(): the next take() keeps that slot (the state the run continues from) and
  // writes the other, whatever it holds.
  void resumed_from(int slot) {
    newest_ = slot;
    started_ = true;
  }
  // Deletes both slots' files (the end of a run: its last checkpoint is on disk).
  void remove();
  // Renames both slots' files to <name>.<suffix> (newer state this run does not take, kept
  // for the user to look at or delete) and returns the new data files' names.
  std::vector<std::string> set_aside(const std::string& suffix);

 private:
  std::string prefix_;
  int newest_ = 0;        // the slot of the last take() (or the newest an earlier process left)
  bool started_ = false;  // newest_ is known
  Manifest pending_[2];   // what each slot's index will record (read by its copy's thread)
  // Last: destroyed first, so that a copy still running (its destructor joins it) finds
  // everything else in place.
  AsyncSaver slots_[2];
};

}  // namespace pentad::ckpt
