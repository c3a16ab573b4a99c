#include "parallel/ep/expert_parallel.h"

#include <algorithm>
#include <cstring>
#include <numeric>

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

// The staging and regrouping below are host memory and memcpy: device tensors would need
// device buffers and copy kernels, not built yet.
static void check_host(const Tensor& in, const Tensor& out, const char* op) {
  PENTAD_CHECK(in.device == Device::CPU && out.device == Device::CPU && in.dtype == DType::F32 &&
                   out.dtype == DType::F32,
               "expert parallelism {}: only host f32 tensors for now (parallel.ep or parallel.etp "
               "above 1 with train.device = \"cuda\" is not built yet)",
               op);
}

void ExpertParallel::dispatch(std::span<const int64_t> send, std::span<const int64_t> counts,
                              const Tensor& in, Tensor out) {
  check_host(in, out, "dispatch");
  const int64_t C = in.shape.ndim == 2 ? in.dim(1) : out.dim(1);
  const int64_t Q = etp_.size();
  std::vector<int64_t> to_peer, from_peer;
  per_peer(send, counts, C, to_peer, from_peer);
  int64_t share_rows = 0;
  const std::vector<Block> layout = blocks(counts, share_rows);
  share_.assign(size_t(share_rows * C), 0.0f);  // padded rows travel as zeros
  ep_.all_to_all_v(view_of(share_.data(), Shape{share_rows * C}, in.dtype, in.device), from_peer,
                   in.reshaped(Shape{in.numel()}), to_peer);
  const float* gathered = share_.data();
  if (Q > 1) {
    gathered_.resize(size_t(Q * share_rows * C));
    etp_.all_gather(view_of(gathered_.data(), Shape{Q * share_rows * C}),
                    view_of(share_.data(), Shape{share_rows * C}));
    gathered = gathered_.data();
  }
  float* dst = out.f32();
  for (const Block& b : layout)
    if (b.rows > 0)
      std::memcpy(dst + b.expert_major * C, gathered + b.gathered * C,
                  size_t(b.rows * C) * sizeof(float));
}

void ExpertParallel::combine(std::span<const int64_t> send, std::span<const int64_t> counts,
                             const Tensor& in, Tensor out) {
  check_host(in, out, "combine");
  const int64_t C = out.dim(1), Q = etp_.size();
  std::vector<int64_t> to_peer, from_peer;
  per_peer(send, counts, C, to_peer, from_peer);
  int64_t share_rows = 0;
  const std::vector<Block> layout = blocks(counts, share_rows);
  gathered_.assign(size_t(Q * share_rows * C), 0.0f);
  const float* src = in.f32();
  for (const Block& b : layout)
    if (b.rows > 0)
      std::memcpy(gathered_.data() + b.gathered * C, src + b.expert_major * C,
                  size_t(b.rows * C) * sizeof(float));
  float* share = gathered_.data();
  if (Q > 1) {  // every etp rank's partial sums of this rank's rows, added up
    share_.resize(size_t(share_rows * C));
    etp_.reduce_scatter(view_of(share_.data(), Shape{share_rows * C}),
                        view_of(gathered_.data(), Shape{Q * share_rows * C}));
    share = share_.data();
  }
  ep_.all_to_all_v(out.reshaped(Shape{out.numel()}), to_peer, view_of(share, Shape{share_rows * C}),
                   from_peer);
}

}  // namespace pentad::parallel
