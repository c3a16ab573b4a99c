#pragma once
// The token dispatcher of expert parallelism (MoE Parallel Folding): experts split over the
// ep group, each expert's width over the etp group, on ranks that may also be the dense
// layers' tp, cp or dp ranks (parallel/mesh.h). It moves rows and knows nothing of a model:
// the parallelize step (src/train/parallelize.h) connects it to an MoE block's hooks.
//
// A rank's rows arrive sorted by global expert (send[e] rows for expert e), so the rows for
// each ep rank are one contiguous block. dispatch():
//   1. the counts are exchanged first (exchange_counts: an all-to-all over ep of the
//      per-expert counts, then an all-gather of those over etp);
//   2. an all-to-all-v over ep brings this rank the rows of its experts from every ep rank;
//   3. with etp > 1, an all-gather over etp (padded to the largest share) gives every etp
//      rank the rows of all of them, since each holds a slice of every local expert;
//   4. the rows are regrouped expert-major: local expert i's rows from (etp q, ep j) in
//      (q, j) order, so each expert's rows are contiguous for its GEMMs.
// combine() runs the same path backwards: regroup, a reduce-scatter over etp (summing the
// etp ranks' partial outputs, each rank keeping its own rows) and the all-to-all-v back,
// which leaves the rows in the order dispatch() took them.
//
// Host tensors (MPI) or device tensors (NCCL, parallel/comm.h), in f32 or bf16 (the MoE
// block's compute type): rows move in their own type, 4 or 2 bytes an element, through the
// all-to-alls, the all-gather and the reduce-scatter, which sums bf16 partial outputs in
// bf16 (expert_parallel.cpp, combine). The counts are host integers either way, since the host
// sizes every buffer from them: exchange_counts() blocks until every peer's counts are in
// (an MPI exchange). dispatch() and combine() on device tensors do not make the host wait
// (but to grow the staging, until its size settles): the all-to-alls are ordered with the
// kernels by the stream rule, the regrouping copies and the padding's zeros run on the
// compute stream.
#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm.h"

namespace pentad::parallel {

class ExpertParallel {
 public:
  // ep, etp: this rank's groups (group rank = coordinate); n_experts divisible by ep's size.
  ExpertParallel(Communicator& ep, Communicator& etp, int64_t n_experts);

  int64_t local_experts() const { return local_; }
  // counts[(q * P + j) * El + i]: rows etp rank q received from ep rank j for local expert
  // i (P ep ranks, El local experts), from every rank's send (n_experts values each).
  std::vector<int64_t> exchange_counts(std::span<const int64_t> send);
  // Rows per local expert after dispatch (sums of counts over q and j).
  std::vector<int64_t> expert_rows(std::span<const int64_t> counts) const;

  // Staging for a dispatch of at most `received` rows (etp x the largest share) of C values.
  void reserve(double received, int64_t C, Device device, DType dtype);
  // in: (sum of send, C) rows sorted by expert; out: (sum of counts, C), expert-major.
  void dispatch(std::span<const int64_t> send, std::span<const int64_t> counts, const Tensor& in,
                Tensor out);
  // in: (sum of counts, C) partial outputs, expert-major; out: (sum of send, C), whole.
  void combine(std::span<const int64_t> send, std::span<const int64_t> counts, const Tensor& in,
               Tensor out);

 private:
  // One block of rows: (q, j, i)'s offset in the gathered layout (q-major, padded to the
  // largest share) and in the expert-major one.
  struct Block {
    int64_t gathered, expert_major, rows;
  };
  std::vector<Block> blocks(std::span<const int64_t> counts, int64_t& share_rows) const;
  void per_peer(std::span<const int64_t> send, std::span<const int64_t> counts, int64_t C,
                std::vector<int64_t>& to_peer, std::vector<int64_t>& from_peer) const;

  Communicator& ep_;
  Communicator& etp_;
  int64_t experts_, local_;
  // Views of staging_ on `device`, in `dtype`: this rank's etp share (share_rows, C) and every etp
  // rank's (etp x share_rows, C), the gathered one empty when etp is 1.
  void stage(int64_t share_rows, int64_t C, Device device, DType dtype, Tensor& share,
             Tensor& gathered);
  static size_t staging_bytes(int64_t share_rows, int64_t C, int64_t Q, DType dtype);
  // staging_ made (or kept, emptied) for a share of share_rows rows of C values.
  void fit_staging(int64_t share_rows, int64_t C, Device device, DType dtype);
  Arena staging_;  // on the device of the rows; made by reserve(), grown if need be, never shrunk
};

}  // namespace pentad::parallel
