// Checkpoints of the state parallel.offload = "nvme" keeps in a file per rank (AdamW's m
// and v; at ZeRO-3 with parallel.offload_params the parameter shares as well).
//
// Why at save(), on the training thread: the saver's copy follows the optimizer chunk by
// chunk in memory, but here the next step rewrites the file sub-group by sub-group through
// the same io_uring queue and streaming buffers (NvmeState is single-threaded, and at
// ZeRO-3 the forward pass reads parameter shares from it too). So save() reads the
// offloaded tensors of this rank's snapshot straight into the saver's staging buffer (one
// pass over the file, whole sub-groups per request, each byte copied once from the
// streaming buffer into staging, where O_DIRECT alignment cannot place it directly) and
// only then returns; the next update() cannot start before. A file-to-file copy would
// need a second file's worth of drive space and a read of it again for the writer, and
// no snapshot in memory for restore_snapshot(). The read is blocked time: begin() counts
// it in the saver's blocked seconds (the end-of-run checkpoint summary), and each save
// logs it.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/check.h"
#include "train/checkpoint_manager.h"

namespace pentad {

namespace {

// Calls copy(slice, lo, hi) for every slice's elements [lo, hi) (shard offsets) inside
// the sub-group [begin, end).
template <typename Slices, typename Copy>
void for_slices_in(const Slices& slices, int64_t begin, int64_t end, const Copy& copy) {
  for (const auto& s : slices) {
    const int64_t lo = std::max(begin, s.shard), hi = std::min(end, s.shard + s.count);
    if (lo < hi) copy(s, lo, hi);
  }
}

}  // namespace

void CheckpointManager::stage_from_nvme(const std::vector<float*>& staged) {
  // A ZeRO-3 share read ahead (evaluation) must land before the file is streamed.
  settle_offloaded_shares_();
  const auto start = std::chrono::steady_clock::now();
  int64_t elements = 0;
  optimizer_.scan_state([&](int64_t begin, int64_t end, float* const* state) {
    for_slices_in(snapshot_on_nvme_, begin, end, [&](const NvmeSlice& s, int64_t lo, int64_t hi) {
      if (bug_injected("nvme-snapshot-skip-v") && s.tensor == 1) return;  // planted for the test
      std::memcpy(staged[s.index] + (lo - s.shard), state[s.tensor] + (lo - begin),
                  static_cast<size_t>(hi - lo) * sizeof(float));
      elements += hi - lo;
    });
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (logs())
    spdlog::info(
        "checkpoint: {} of NVMe-offloaded state read into the snapshot in {:.3f} s (rank 0; "
        "training waited for it)",
        format_bytes(static_cast<size_t>(elements) * sizeof(float)), seconds);
}

void CheckpointManager::unstage_to_nvme(const std::vector<float*>& staged) {
  // One read-modify-write pass over the file: snapshot_covers_nvme() said every element
  // is in the snapshot, so nothing of the state after the snapshot survives.
  optimizer_.rewrite_state([&](int64_t begin, int64_t end, float* const* state) {
    for_slices_in(snapshot_on_nvme_, begin, end, [&](const NvmeSlice& s, int64_t lo, int64_t hi) {
      std::memcpy(state[s.tensor] + (lo - begin), staged[s.index] + (lo - s.shard),
                  static_cast<size_t>(hi - lo) * sizeof(float));
    });
  });
}

void CheckpointManager::prepare_nvme_restore() {
  // Collective: every rank must hold its whole file's state in its own snapshot.
  if (all_ranks(snapshot_covers_nvme() ? 0 : 1, parallel::ReduceOp::Max) != 0)
    fail(
        "cannot restore the in-memory snapshot with parallel.offload = \"nvme\": a rank's "
        "snapshot leaves out state it shares with another rank (a data- or tensor-parallel "
        "replica, a tied embedding's copy), and offloaded state cannot be broadcast from a "
        "view; resume from the checkpoint on disk (--resume latest), or use parallel.zero >= 1 "
        "with tp = pp = 1");
  settle_offloaded_shares_();  // no read of the file in flight
}

bool CheckpointManager::snapshot_covers_nvme() const {
  // Slices never overlap (each is one share of one parameter), so counting suffices.
  const NvmeState* nvme = optimizer_.nvme();
  std::vector<int64_t> held(static_cast<size_t>(nvme->tensors()), 0);
  for (const NvmeSlice& s : snapshot_on_nvme_) held[static_cast<size_t>(s.tensor)] += s.count;
  return std::all_of(held.begin(), held.end(),
                     [&](int64_t n) { return n == optimizer_.shard().numel; });
}

}  // namespace pentad
