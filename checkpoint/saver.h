#pragma once
// Lazy asynchronous saving. At a save step the state a bitwise resume needs (parameters,
// AdamW moments; step and schedule go in the manifest) does not change until the next
// optimizer step, so begin() returns at once and a background thread copies it into one
// host staging buffer while the next forward and backward compute. The thread copies the
// tensors in the order given, in pieces, checksumming each piece while it is still in
// cache, and publishes how far it got: the optimizer, updating in the same order, waits
// before each chunk only until the copy has passed that chunk (wait_for_copy(begin, end)).
// Then the same thread writes the staged copy to this rank's HDF5 file (and the mirror's).
// Committing (every rank done, manifest, atomic rename) is collective and happens on the
// training thread: see Trainer.
//
// Device state (LiveTensor::device CUDA): begin(), on the thread that issues the kernels,
// orders a private copy stream after every kernel issued so far (the optimizer step that
// made the state); the background thread then copies device -> page-locked staging in
// pieces on that stream and publishes a piece only after the stream has finished it, so
// the optimizer, which waits on the host before issuing each chunk's update, never
// overwrites what the copy has yet to read. Checksums and the write use the host copy.
//
// The staging buffer keeps the newest snapshot in host memory until the next save:
// restore() copies it back into the live state, for a restart inside the job.
//
// Frozen snapshots (begin(..., frozen = true)): the caller promises that the tensors stay
// unchanged until the next begin() (the optimizer writes a second set of the state and
// swaps: AdamW::step out of place). Nothing waits for the copy then, and host tensors are
// not copied at all: the background thread checksums and writes them where they lie. The
// caller keeps the snapshot in memory itself (its second set), so restore() is refused.
//
// Shared staging (set_shared_staging(path)): the buffer is a file mapped into memory (on a
// tmpfs such as /dev/shm), so that it outlives the process: the in-memory checkpoint level
// (checkpoint/memory_level.h) keeps its snapshots there, with an index written by
// set_on_copied()'s callback once a copy is whole.
//
// State that is not in memory (AdamW's on NVMe: LiveTensor::from_caller) has no live
// pointer to copy from: begin()'s `fill` writes it into its staging, on the calling
// thread, before begin() returns (that time counts as blocked); the background thread
// then only checksums and writes it. restore()'s `put` takes it back from staging.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/device_memory.h"

namespace pentad::ckpt {

class Xxh3Stream;

// Each tensor's place in staging starts on a page (direct I/O writes it from there): the
// staged tensors follow each other in their order, each rounded up to this many floats.
inline constexpr size_t kStagingAlignFloats = 4096 / sizeof(float);

struct LiveTensor {
  ShardInfo info;               // global identity of the shard this rank holds
  float* live = nullptr;        // the training state: read by the copy, written only by restore()
  Device device = Device::CPU;  // where `live` is
  bool from_caller = false;     // live is null: begin()'s fill stages it, restore()'s put reads it
};

// Frees a staging buffer: a shared mapping of `mapped` bytes (munmap), or std::free's.
struct StagingFree {
  size_t mapped = 0;
  void operator()(float* p) const;
};

class AsyncSaver {
 public:
  AsyncSaver() = default;
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Starts a snapshot of `tensors` (empty on ranks that write nothing) into each of
  // `files` in turn: the local checkpoint first, then any further level (a shared store).
  // The copy goes in the order of `tensors`. asynchronous = false copies and writes
  // before returning (the synchronous peer). Call it on the thread that issues the
  // kernels when any tensor is device memory.
  // fill: called once, before the copy starts, with each tensor's place in staging (null
  // where none); it writes the from_caller tensors there. Copy snapshots only.
  using Staged = std::function<void(const std::vector<float*>& staged)>;
  void begin(std::vector<std::string> files, std::vector<LiveTensor> tensors, bool asynchronous,
             bool frozen = false, const Staged& fill = {});
  // Allocates and writes the staging buffer for snapshots of `tensors` now (at start-up),
  // so that no save pays for it. Not needed for frozen snapshots of host memory.
  // touch = false leaves what a shared staging file holds (allocated already).
  void reserve(const std::vector<LiveTensor>& tensors, bool touch = true);
  size_t staging_bytes() const { return staging_capacity_ * sizeof(float); }
  // The staging a snapshot of `tensors` takes, in floats (each tensor from a page on).
  static size_t staging_floats(const std::vector<LiveTensor>& tensors);
  // Blocks until the snapshot holds its copy of every live element in [begin, end) (at
  // once for memory it does not hold): call before overwriting that range.
  void wait_for_copy(const float* begin, const float* end);
  // Blocks until the whole copy is complete.
  void wait_for_copy();
  // Whether a snapshot's copy is still running (the only time wait_for_copy can block).
  bool copying() const { return busy_ && !frozen_ && !copied_.load(std::memory_order_acquire); }
  // Whether the file is written (or failed); wait_for_file() blocks until then and
  // rethrows a failure (the copy's, or the first file's) as pentad::Error.
  bool file_done() const { return !busy_ || file_done_.load(); }
  void wait_for_file();
  // Once the file is done: each file's error ("" where it was written), in the order
  // begin() took them. Each file is tried whatever happened to the others, so that one
  // full level does not cost the others their checkpoint. A failed copy fails them all.
  const std::vector<std::string>& file_errors() const { return file_errors_; }
  bool pending() const { return busy_; }

  // The staging buffer as the file `path`, mapped shared, instead of private memory: it
  // outlives the process. Allocated (all of it, so that a full tmpfs fails here and not
  // with SIGBUS mid-copy) by reserve() or the first copy. Before any snapshot.
  void set_shared_staging(std::string path);
  // Called on the background thread once a snapshot's copy is whole, before its files are
  // written; an exception it throws fails the snapshot. staged_shards() is valid there.
  void set_on_copied(std::function<void()> on_copied) { on_copied_ = std::move(on_copied); }
  // The snapshot's shards as staged: each tensor's identity with its checksum.
  std::vector<ShardInfo> staged_shards() const;

  // Copies the newest snapshot back into the live memory it was taken from (after its
  // copy completes; its file may still be in flight), device memory included (ordered
  // with the kernels of the calling thread). False when there is none. put: given each
  // tensor's place in staging, copies the from_caller tensors back (required if any).
  bool restore(const Staged& put = {});

  // Deletes directories (what ckpt::commit retired) on a background thread, so that the
  // training thread never waits for the file system to free them (most of a second for a
  // GiB-sized file where it discards freed blocks). One batch at a time: a new batch first
  // waits for the previous one, and so does wait_for_removal() and the destructor.
  void remove_later(std::vector<std::string> dirs);
  // Whether removal keeps each rank file for the next save of that rank to write over
  // (write_rank_file's recycle), instead of deleting it. Off by default. Rank files go to
  // the pool before anything is deleted, and a file this saver writes waits for that:
  // the rank that commits (and removes) always finds its own; the others, whose old files
  // it moves too, find theirs unless they write sooner.
  void set_recycling(bool recycle) { recycle_ = recycle; }
  int recycled_files() const { return recycled_files_; }  // so far; read once a file is done
  void wait_for_removal();

  // Seconds the training thread spent blocked in begin(), wait_for_copy(),
  // wait_for_file(), remove_later() and wait_for_removal(), in total.
  double blocked_seconds() const { return blocked_seconds_; }

  // The background thread's last snapshot: seconds spent copying (with checksums) and
  // writing every file, and its own CPU time for each (user + system).
  struct Timings {
    double copy_seconds = 0, copy_cpu_seconds = 0, write_seconds = 0, write_cpu_seconds = 0;
  };
  Timings last_timings() const { return timings_; }  // valid once the file is done

 private:
  void run();  // the background thread: copy, then write
  void ensure_staging(size_t floats, bool pinned);
  bool staged() const;  // this snapshot goes through staging_ (not frozen host memory)
  std::vector<float*> staged_places() const;  // each tensor's place in staging_
  void copy();
  void copy_from_device(size_t i);     // tensor i, in pieces
  void publish(size_t staged_floats);  // the copy holds staging_[0, staged_floats)

  std::vector<std::string> files_;
  std::vector<LiveTensor> tensors_;
  std::vector<size_t> staged_at_;                  // each tensor's offset in staging_, floats
  std::vector<uint64_t> checksums_;                // each tensor's, computed during the copy
  std::unique_ptr<float[], StagingFree> staging_;  // page-aligned (direct I/O), uninitialised
  size_t staging_capacity_ = 0;                    // floats
  bool staging_pinned_ = false;                    // page-locked for device copies (host_pin)
  AsyncCopier copier_;                             // device -> staging
  std::string shared_path_;                        // set_shared_staging()
  std::function<void()> on_copied_;                // set_on_copied()
  std::thread thread_;
  std::thread remover_;  // remove_later()'s
  bool busy_ = false;
  bool recycle_ = false;
  int recycled_files_ = 0;
  // False while remove_later()'s thread moves retired rank files to the pool: the writer
  // waits for it, so that this process's next file finds its old one there.
  std::atomic<bool> pooled_{true};
  bool background_ = false;    // run() is on its own thread
  bool frozen_ = false;        // begin(..., frozen): the tensors do not change until the next
  bool has_snapshot_ = false;  // a copy of the newest snapshot is (being) staged
  bool copy_ok_ = false;       // ... and its copy completed (read after copied_)
  // Floats of staging_ copied so far, in staging order (gaps between tensors included).
  std::atomic<size_t> copied_floats_{0};
  std::atomic<bool> copied_{false}, file_done_{false};
  std::string error_;                     // the copy's, or the first file's
  std::vector<std::string> file_errors_;  // one per file
  double blocked_seconds_ = 0.0;
  Timings timings_;
};

}  // namespace pentad::ckpt
