#include "parallel/ep/expert_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/device_memory.h"
#include "kernels/ops.h"

namespace pentad::parallel {

ExpertParallel::ExpertParallel(Communicator& ep, Communicator& etp, int64_t n_experts)
    : ep_(ep), etp_(etp), experts_(n_experts), local_(n_experts / ep.size()) {
  PENTAD_CHECK(n_experts % ep.size() == 0, "{} experts over ep {}", n_experts, ep.size());
}

std::vector<int64_t> ExpertParallel::exchange_counts(std::span<const int64_t> send) {
  PENTAD_CHECK(int64_t(send.size()) == experts_, "send has {} counts, want {}", send.size(),
               experts_);
  const int P = ep_.size(), Q = etp_.size();
  // Block j of the all-to-all: the counts for ep rank j's experts.
  std::vector<int32_t> mine(send.begin(), send.end());
  std::vector<int32_t> from_ep(static_cast<size_t>(experts_));
  ep_.all_to_all(view_of(from_ep.data(), Shape{experts_}, DType::I32),
                 view_of(mine.data(), Shape{experts_}, DType::I32));
  std::vector<int32_t> all(size_t(Q) * size_t(P * local_));
  etp_.all_gather(view_of(all.data(), Shape{int64_t(all.size())}, DType::I32),
                  view_of(from_ep.data(), Shape{experts_}, DType::I32));
  return std::vector<int64_t>(all.begin(), all.end());
}

std::vector<int64_t> ExpertParallel::expert_rows(std::span<const int64_t> counts) const {
  std::vector<int64_t> rows(size_t(local_), 0);
  for (size_t n = 0; n < counts.size(); ++n) rows[n % size_t(local_)] += counts[n];
  return rows;
}

std::vector<ExpertParallel::Block> ExpertParallel::blocks(std::span<const int64_t> counts,
                                                          int64_t& share_rows) const {
  const int64_t P = ep_.size(), Q = etp_.size(), El = local_;
  auto count = [&](int64_t q, int64_t j, int64_t i) {
    return counts[size_t((q * P + j) * El + i)];
  };
  share_rows = 0;  // the largest etp share: the gathered layout's padded block
  for (int64_t q = 0; q < Q; ++q) {
    int64_t rows = 0;
    for (int64_t n = 0; n < P * El; ++n) rows += counts[size_t(q * P * El + n)];
    share_rows = std::max(share_rows, rows);
  }
  std::vector<Block> out(size_t(Q * P * El));
  for (int64_t q = 0; q < Q; ++q) {
    int64_t at = q * share_rows;
    for (int64_t j = 0; j < P; ++j)
      for (int64_t i = 0; i < El; ++i) {
        Block& b = out[size_t((q * P + j) * El + i)];
        b.gathered = at;
        b.rows = count(q, j, i);
        at += b.rows;
      }
  }
  int64_t at = 0;
  for (int64_t i = 0; i < El; ++i)
    for (int64_t q = 0; q < Q; ++q)
      for (int64_t j = 0; j < P; ++j) {
        Block& b = out[size_t((q * P + j) * El + i)];
        b.expert_major = at;
        at += b.rows;
      }
  return out;
}

// Elements this rank sends to and receives from each ep rank (this etp rank's share).
void ExpertParallel::per_peer(std::span<const int64_t> send, std::span<const int64_t> counts,
                              int64_t C, std::vector<int64_t>& to_peer,
                              std::vector<int64_t>& from_peer) const {
  const int64_t P = ep_.size(), El = local_, q = etp_.rank();
  to_peer.assign(size_t(P), 0);
  from_peer.assign(size_t(P), 0);
  for (int64_t j = 0; j < P; ++j)
    for (int64_t i = 0; i < El; ++i) {
      to_peer[size_t(j)] += send[size_t(j * El + i)] * C;
      from_peer[size_t(j)] += counts[size_t((q * P + j) * El + i)] * C;
    }
}

// Host rows go through MPI, device rows through NCCL (the communicator picks by device); the
// staging follows the rows and the regrouping copies stay on their device.
static void check_rows(const Tensor& in, const Tensor& out, const char* op) {
  PENTAD_CHECK(in.device == out.device && in.dtype == out.dtype &&
                   (in.dtype == DType::F32 || in.dtype == DType::BF16),
               "expert parallelism {}: f32 or bf16 rows of one type on one device, got {} on {} "
               "and {} on {}",
               op, dtype_name(in.dtype), device_name(in.device), dtype_name(out.dtype),
               device_name(out.device));
}

size_t ExpertParallel::staging_bytes(int64_t share_rows, int64_t C, int64_t Q, DType dtype) {
  const int64_t gathered_rows = Q > 1 ? Q * share_rows : 0;
  const size_t element = dtype_bytes(dtype);
  // At least one alignment: an arena of no bytes has no memory, and its views none either.
  return std::max(Arena::kAlignment, Arena::aligned(size_t(share_rows * C) * element) +
                                         Arena::aligned(size_t(gathered_rows * C) * element));
}

void ExpertParallel::fit_staging(int64_t share_rows, int64_t C, Device device, DType dtype) {
  const size_t bytes = staging_bytes(share_rows, C, etp_.size(), dtype);
  if (staging_.capacity() < bytes || staging_.device() != device)
    staging_ = Arena("expert-parallel staging", bytes, device);
  else
    staging_.reset();
}

void ExpertParallel::reserve(double received, int64_t C, Device device, DType dtype) {
  fit_staging(int64_t(std::ceil(received / double(etp_.size()))), C, device, dtype);
}

void ExpertParallel::stage(int64_t share_rows, int64_t C, Device device, DType dtype, Tensor& share,
                           Tensor& gathered) {
  const int64_t Q = etp_.size();
  const int64_t gathered_rows = Q > 1 ? Q * share_rows : 0;
  fit_staging(share_rows, C, device, dtype);
  share = staging_.alloc(Shape{share_rows, C}, dtype);
  gathered = staging_.alloc(Shape{gathered_rows, C}, dtype);
}

// Zeros on the tensor's device; nothing when it is empty (an empty arena has no memory).
// Host bf16 is plain words (the CPU kernels take f32 and f64 only), so the host clears bytes.
static void zero_rows(const Tensor& t) {
  if (t.numel() == 0) return;
  if (t.device == Device::CPU)
    std::memset(t.data, 0, t.bytes());
  else
    kernels::zero(t);
}

// Copies block b's rows between the gathered layout and the expert-major one, on the rows'
// device (a device-to-device copy does not make the host wait). Offsets in bytes, from the
// rows' element size.
static void copy_rows(const Tensor& dst, int64_t dst_row, const Tensor& src, int64_t src_row,
                      int64_t rows, int64_t C) {
  if (rows == 0) return;
  const size_t row_bytes = size_t(C) * dtype_bytes(src.dtype);
  PENTAD_CHECK(dst.dtype == src.dtype, "copy_rows: {} into {}", dtype_name(src.dtype),
               dtype_name(dst.dtype));
  copy_bytes(static_cast<char*>(dst.data) + size_t(dst_row) * row_bytes, dst.device,
             static_cast<const char*>(src.data) + size_t(src_row) * row_bytes, src.device,
             size_t(rows) * row_bytes);
}

void ExpertParallel::dispatch(std::span<const int64_t> send, std::span<const int64_t> counts,
                              const Tensor& in, Tensor out) {
  check_rows(in, out, "dispatch");
  const int64_t C = in.shape.ndim == 2 ? in.dim(1) : out.dim(1);
  const int64_t Q = etp_.size();
  std::vector<int64_t> to_peer, from_peer;
  per_peer(send, counts, C, to_peer, from_peer);
  int64_t share_rows = 0;
  const std::vector<Block> layout = blocks(counts, share_rows);
  Tensor share, gathered;
  stage(share_rows, C, in.device, in.dtype, share, gathered);
  zero_rows(share);  // padded rows travel as zeros
  ep_.all_to_all_v(share.reshaped(Shape{share.numel()}), from_peer, in.reshaped(Shape{in.numel()}),
                   to_peer);
  if (Q > 1) {
    etp_.all_gather(gathered.reshaped(Shape{gathered.numel()}),
                    share.reshaped(Shape{share.numel()}));
  } else {
    gathered = share;
  }
  for (const Block& b : layout) copy_rows(out, b.expert_major, gathered, b.gathered, b.rows, C);
}

void ExpertParallel::combine(std::span<const int64_t> send, std::span<const int64_t> counts,
                             const Tensor& in, Tensor out) {
  check_rows(in, out, "combine");
  const int64_t C = out.dim(1), Q = etp_.size();
  std::vector<int64_t> to_peer, from_peer;
  per_peer(send, counts, C, to_peer, from_peer);
  int64_t share_rows = 0;
  const std::vector<Block> layout = blocks(counts, share_rows);
  Tensor share, gathered;
  stage(share_rows, C, in.device, in.dtype, share, gathered);
  // Every etp rank's partial sums of the rows, laid out for the reduce-scatter (etp 1: this
  // rank's share alone).
  Tensor partial = Q > 1 ? gathered : share;
  zero_rows(partial);
  for (const Block& b : layout) copy_rows(partial, b.gathered, in, b.expert_major, b.rows, C);
  // Every etp rank's partial sums of this rank's rows, added up in the rows' type: bf16 rows
  // are summed in bf16 (NCCL's bf16 sum, the MPI backend's bf16 op: each pairwise step
  // rounded to bf16), as Megatron reduces in the compute dtype. Widening to f32 first would
  // double the bytes moved and need an f32 staging and two casts, for a result that is rounded
  // to bf16 at the end anyway: with etp 2 the two agree exactly (one rounding of the same
  // f32 sum of two bf16 values); with more ranks, each further step adds at most half a bf16
  // ulp of the partial sum.
  if (Q > 1)
    etp_.reduce_scatter(share.reshaped(Shape{share.numel()}),
                        partial.reshaped(Shape{partial.numel()}));
  ep_.all_to_all_v(out.reshaped(Shape{out.numel()}), to_peer, share.reshaped(Shape{share.numel()}),
                   from_peer);
}

}  // namespace pentad::parallel
