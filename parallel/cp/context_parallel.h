#pragma once
// Context parallelism: attention over a sequence whose tokens are split over cp ranks.
//
// cp = U x R ranks. U is the Ulysses degree (DeepSpeed-Ulysses: an all-to-all turns
// sequence shards into head shards before attention and back after it), R the ring degree
// (Ring Attention: K/V blocks travel around the ring while each rank keeps its queries).
// "ulysses" is U = cp, "ring" R = cp, "hybrid" both, Ulysses on the inner (adjacent) ranks:
// cp rank c has Ulysses rank u = c % U and ring rank r = c / U.
//
// Token layout (context_positions): the sequence of T tokens is cut into 2R chunks; ring
// rank r holds chunks r and 2R-1-r (zig-zag, so that under the causal mask every ring rank
// does the same work), T/R tokens in ascending order, and cuts them into U contiguous
// pieces, piece u for Ulysses rank u. With R = 1 that is piece u of the whole sequence.
// After the Ulysses all-to-all a rank holds all T/R tokens of its ring rank for 1/U of the
// heads, so the ring works on whole zig-zag slices.
//
// Attention of one block is kernels::attention_forward with the positions of the queries
// and of the block's keys (the causal mask by global position); blocks merge by their
// log-sum-exp. Backward rotates K/V once more and sends each block's dK/dV along with it
// until it is back at its owner. Transfers are posted before the block they overlap is
// computed.
//
// Grouped-query attention under Ulysses: a rank's Hq/U query heads need their kv heads; when
// U > Hkv each kv head goes to the U/Hkv ranks whose query heads read it (replicated), and
// their gradients are summed on the way back. Needs Hq % U == 0 and Hkv % U == 0 or
// U % Hkv == 0 (checked by the recipe, src/recipe/recipe_checks.cpp).
//
// Communication per layer and micro-batch, as the trace counts it (an all-to-all: its whole
// send buffer, the block a rank keeps included; a send: its bytes). e bytes per value;
// t = T / (U R) tokens here; Hq, Hkv heads on this rank (after tp); kvc = max(1, Hkv / U):
//   Ulysses, s_q = b t Hq D e, s_kv = U b t kvc D e (kv heads replicated when U > Hkv):
//     forward  2 s_q + 2 s_kv        q, k, v in; out back
//     backward 4 s_q + 4 s_kv        q, k, v, out, dout in again; dq, dk, dv back
//     (U - 1) / U of it leaves the rank.
//   Ring, one K/V block kv = 2 b (T / R) kvc D e (kvc = Hkv when U = 1):
//     forward  (R - 1) kv            K/V blocks
//     backward (R - 1) kv + R kv     K/V again; dK/dV partials, the last one home
// bench/cp_comm_volume.py checks these against the communication trace.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm.h"

namespace pentad::parallel {

// Global positions of the T / (U * R) tokens of Ulysses rank u in ring rank r, ascending.
// Needs T % (2R) == 0 when R > 1 and (T / R) % U == 0.
std::vector<int32_t> context_positions(int64_t seq_len, int ulysses, int ring, int u, int r);

struct ContextShape {
  int64_t batch = 1;     // b
  int64_t seq_len = 0;   // T, the whole sequence
  int64_t heads = 0;     // query heads on this rank (after tensor parallelism)
  int64_t kv_heads = 0;  // kv heads on this rank
  int64_t head_dim = 0;
};

class ContextParallel {
 public:
  // ulysses / ring: the groups (null = degree 1). Scratch is allocated on `device`.
  ContextParallel(Communicator* ulysses, Communicator* ring, const ContextShape& shape, DType dtype,
                  Device device);
  ContextParallel(const ContextParallel&) = delete;
  ContextParallel& operator=(const ContextParallel&) = delete;

  int degree() const { return ulysses_degree() * ring_degree(); }
  int ulysses_degree() const { return ulysses_ ? ulysses_->size() : 1; }
  int ring_degree() const { return ring_ ? ring_->size() : 1; }
  int64_t local_len() const { return shape_.seq_len / degree(); }
  // This rank's token positions: host, and I32 (t) on the compute device.
  const std::vector<int32_t>& positions() const { return positions_; }
  Tensor positions_tensor() const { return positions_dev_; }
  size_t scratch_bytes() const { return scratch_.capacity(); }

  // q, out (b, t, Hq, D); k, v (b, t, Hkv, D): this rank's tokens, RoPE applied. lse holds
  // b*Hq*t values, in whatever layout backward wants back.
  void forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v);
  // dq, dk, dv overwritten.
  void backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q,
                const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse);

  // Timestamps (trace clock) of the last forward's ring steps: when each block's attention
  // began and ended. The communication trace shows the transfers posted around them.
  struct Span {
    int64_t begin_ns = 0, end_ns = 0;
  };
  const std::vector<Span>& ring_compute_spans() const { return spans_; }

 private:
  struct Heads {        // a Ulysses exchange of one tensor kind
    int64_t count = 0;  // heads per rank after the exchange
    int64_t total = 0;  // heads per rank before it
  };
  void seq_to_heads(Tensor out, const Tensor& in, const Heads& h);
  void heads_to_seq(Tensor out, const Tensor& in, const Heads& h);
  void ring_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v);
  void ring_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q,
                     const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse);
  Tensor ring_pos(int ring_rank) const;            // positions of a ring rank's slice, or absent
  void pack_kv(const Tensor& k, const Tensor& v);  // this rank's block into kv_[0]

  Communicator* ulysses_;
  Communicator* ring_;
  ContextShape shape_;
  DType dtype_;
  Device device_;
  Heads qh_, kvh_;
  std::vector<int32_t> positions_;
  Arena scratch_;
  Tensor positions_dev_;
  std::vector<Tensor> ring_pos_;  // per ring rank, I32 (T/R)
  // Ulysses: exchange buffers, and the head-sharded tensors the ring (or the kernel) sees.
  Tensor send_, recv_, replica_;
  Tensor q_h_, k_h_, v_h_, out_h_, dout_h_, dq_h_, dk_h_, dv_h_;
  // Ring: K/V blocks (k then v, packed), dK/dV partials, one block's output.
  Tensor kv_[2], dkv_[2], dkv_in_, block_out_, block_lse_;
  std::vector<Span> spans_;
};

}  // namespace pentad::parallel
