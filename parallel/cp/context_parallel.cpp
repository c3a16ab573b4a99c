#include "parallel/cp/context_parallel.h"

#include <algorithm>

#include "core/check.h"
#include "core/device_memory.h"
#include "kernels/ops.h"

namespace pentad::parallel {

namespace k = kernels;

std::vector<int32_t> context_positions(int64_t seq_len, int ulysses, int ring, int u, int r) {
  PENTAD_CHECK(ulysses >= 1 && ring >= 1 && 0 <= u && u < ulysses && 0 <= r && r < ring,
               "context_positions: rank ({}, {}) of ({}, {})", u, r, ulysses, ring);
  PENTAD_CHECK((ring == 1 || seq_len % (2 * ring) == 0) && (seq_len / ring) % ulysses == 0,
               "context_positions: seq_len {} does not split over ulysses {} x ring {}", seq_len,
               ulysses, ring);
  std::vector<int32_t> slice;  // ring rank r's tokens
  if (ring == 1) {
    for (int64_t i = 0; i < seq_len; ++i) slice.push_back(int32_t(i));
  } else {
    const int64_t chunk = seq_len / (2 * ring);
    for (int64_t c : {int64_t(r), int64_t(2 * ring - 1 - r)})
      for (int64_t i = 0; i < chunk; ++i) slice.push_back(int32_t(c * chunk + i));
  }
  const int64_t piece = int64_t(slice.size()) / ulysses;
  return {slice.begin() + u * piece, slice.begin() + (u + 1) * piece};
}

namespace {

Tensor upload(Arena& arena, const std::vector<int32_t>& host, Device device) {
  Tensor t = arena.alloc(Shape{int64_t(host.size())}, DType::I32);
  if (t.data) copy_bytes(t.data, device, host.data(), Device::CPU, t.bytes());
  return t;
}

// Packed K/V block: k then v, each (b, t, h, d).
Tensor half(const Tensor& packed, int i, Shape shape) {
  const int64_t n = shape.numel();
  Tensor t = packed.reshaped(Shape{2, n}).rows(i, 1);
  return t.reshaped(shape);
}

constexpr int kTagKv = 11, kTagDkv = 12;

}  // namespace

ContextParallel::ContextParallel(Communicator* ulysses, Communicator* ring,
                                 const ContextShape& shape, DType dtype, Device device)
    : ulysses_(ulysses && ulysses->size() > 1 ? ulysses : nullptr),
      ring_(ring && ring->size() > 1 ? ring : nullptr),
      shape_(shape),
      dtype_(dtype),
      device_(device) {
  const int U = ulysses_degree(), R = ring_degree();
  const int u = ulysses_ ? ulysses_->rank() : 0, r = ring_ ? ring_->rank() : 0;
  const ContextShape& s = shape_;
  PENTAD_CHECK(s.heads % U == 0 && (s.kv_heads % U == 0 || U % s.kv_heads == 0),
               "ulysses {} does not split {} query / {} kv heads", U, s.heads, s.kv_heads);
  qh_ = {s.heads / U, s.heads};
  kvh_ = {std::max<int64_t>(1, s.kv_heads / U), s.kv_heads};
  positions_ = context_positions(s.seq_len, U, R, u, r);
  const int64_t t = local_len(), tr = s.seq_len / R, D = s.head_dim, B = s.batch;
  const DType lse_type = device == Device::CUDA ? DType::F32 : dtype;
  auto plan = [&](Arena& a) {
    positions_dev_ = upload(a, positions_, device);
    ring_pos_.clear();
    if (R > 1)  // a ring rank's whole zig-zag slice: its Ulysses pieces together
      for (int i = 0; i < R; ++i)
        ring_pos_.push_back(upload(a, context_positions(s.seq_len, 1, R, 0, i), device));
    if (U > 1) {
      const Shape q{B, tr, qh_.count, D}, kv{B, tr, kvh_.count, D};
      const int64_t exchange = std::max(B * t * s.heads, U * B * t * kvh_.count) * D;
      send_ = a.alloc(Shape{exchange}, dtype);
      recv_ = a.alloc(Shape{exchange}, dtype);
      if (U > s.kv_heads) replica_ = a.alloc(Shape{B, t, s.kv_heads, D}, dtype);
      q_h_ = a.alloc(q, dtype);
      out_h_ = a.alloc(q, dtype);
      dout_h_ = a.alloc(q, dtype);
      dq_h_ = a.alloc(q, dtype);
      for (Tensor* x : {&k_h_, &v_h_, &dk_h_, &dv_h_}) *x = a.alloc(kv, dtype);
    }
    if (R > 1) {
      const int64_t kv = 2 * B * tr * kvh_.count * D;
      for (Tensor* x : {&kv_[0], &kv_[1], &dkv_[0], &dkv_[1], &dkv_in_})
        *x = a.alloc(Shape{kv}, dtype);
      block_out_ = a.alloc(Shape{B, tr, qh_.count, D}, dtype);
      block_lse_ = a.alloc(Shape{B, qh_.count, tr}, lse_type);
    }
  };
  Arena measure = Arena::measuring("context parallel");
  plan(measure);
  scratch_ = Arena("context parallel", measure.used(), device);
  plan(scratch_);
}

void ContextParallel::pack_kv(const Tensor& k, const Tensor& v) {
  copy(half(kv_[0], 0, k.shape), k);
  copy(half(kv_[0], 1, k.shape), v);
}

Tensor ContextParallel::ring_pos(int ring_rank) const {
  return ring_ ? ring_pos_[size_t(ring_rank)] : Tensor{};
}

// in (b, t, total, D) -> out (b, U*t, count, D): this rank's heads of every rank's tokens.
// Destination j gets heads [j*total/U, +count) (a kv head goes to every rank reading it).
void ContextParallel::seq_to_heads(Tensor out, const Tensor& in, const Heads& h) {
  const int U = ulysses_degree();
  const int64_t B = shape_.batch, t = local_len(), D = shape_.head_dim;
  const size_t e = dtype_bytes(dtype_), chunk = size_t(B * t * h.count * D);
  for (int j = 0; j < U; ++j)
    copy_2d(static_cast<char*>(send_.data) + j * chunk * e, size_t(h.count * D) * e,
            static_cast<const char*>(in.data) + size_t(j * h.total / U * D) * e,
            size_t(h.total * D) * e, size_t(h.count * D) * e, size_t(B * t), device_);
  const Shape whole{int64_t(U * chunk)};
  ulysses_->all_to_all(recv_.prefix(whole), send_.prefix(whole));
  const size_t piece = size_t(t * h.count * D) * e;  // one source's tokens of one sequence
  for (int j = 0; j < U; ++j)
    copy_2d(static_cast<char*>(out.data) + j * piece, U * piece,
            static_cast<const char*>(recv_.data) + j * chunk * e, piece, piece, size_t(B), device_);
}

// The inverse: in (b, U*t, count, D) -> out (b, t, total, D); heads that went to several
// ranks come back as the sum of their copies (in rank order).
void ContextParallel::heads_to_seq(Tensor out, const Tensor& in, const Heads& h) {
  const int U = ulysses_degree();
  const int64_t B = shape_.batch, t = local_len(), D = shape_.head_dim;
  const size_t e = dtype_bytes(dtype_), chunk = size_t(B * t * h.count * D);
  const size_t piece = size_t(t * h.count * D) * e;
  for (int j = 0; j < U; ++j)
    copy_2d(static_cast<char*>(send_.data) + j * chunk * e, piece,
            static_cast<const char*>(in.data) + j * piece, U * piece, piece, size_t(B), device_);
  const Shape whole{int64_t(U * chunk)};
  ulysses_->all_to_all(recv_.prefix(whole), send_.prefix(whole));
  const int64_t copies = U > h.total ? U / h.total : 1;
  for (int64_t c = 0; c < copies; ++c) {
    Tensor dst = c == 0 ? out : replica_;
    for (int j = int(c); j < U; j += int(copies))
      copy_2d(static_cast<char*>(dst.data) + size_t(j * h.total / U * D) * e,
              size_t(h.total * D) * e, static_cast<const char*>(recv_.data) + j * chunk * e,
              size_t(h.count * D) * e, size_t(h.count * D) * e, size_t(B * t), device_);
    if (c > 0) k::add(out, out, replica_.reshaped(out.shape));
  }
}

void ContextParallel::forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k,
                              const Tensor& v) {
  if (!ulysses_) return ring_forward(out, lse, q, k, v);
  seq_to_heads(q_h_, q, qh_);
  seq_to_heads(k_h_, k, kvh_);
  seq_to_heads(v_h_, v, kvh_);
  const int64_t tr = shape_.seq_len / ring_degree();
  ring_forward(out_h_, lse.reshaped(Shape{shape_.batch, qh_.count, tr}), q_h_, k_h_, v_h_);
  heads_to_seq(out, out_h_, qh_);
}

void ContextParallel::backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q,
                               const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse) {
  if (!ulysses_) return ring_backward(dq, dk, dv, dout, q, k, v, out, lse);
  // The head-sharded inputs are exchanged again rather than kept per layer: memory first.
  seq_to_heads(q_h_, q, qh_);
  seq_to_heads(k_h_, k, kvh_);
  seq_to_heads(v_h_, v, kvh_);
  seq_to_heads(out_h_, out, qh_);
  seq_to_heads(dout_h_, dout, qh_);
  const int64_t tr = shape_.seq_len / ring_degree();
  ring_backward(dq_h_, dk_h_, dv_h_, dout_h_, q_h_, k_h_, v_h_, out_h_,
                lse.reshaped(Shape{shape_.batch, qh_.count, tr}));
  heads_to_seq(dq, dq_h_, qh_);
  heads_to_seq(dk, dk_h_, kvh_);
  heads_to_seq(dv, dv_h_, kvh_);
}

void ContextParallel::ring_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k,
                                   const Tensor& v) {
  spans_.clear();
  if (!ring_) return k::attention_forward(out, lse, q, k, v);
  const int R = ring_degree(), r = ring_->rank();
  const int next = (r + 1) % R, prev = (r + R - 1) % R;
  pack_kv(k, v);
  for (int step = 0; step < R; ++step) {
    const Tensor& here = kv_[step % 2];
    Work recv, send;
    if (step + 1 < R) {  // the next block travels while this one computes
      recv = ring_->recv(kv_[(step + 1) % 2], prev, kTagKv, true);
      send = ring_->send(here, next, kTagKv, true);
    }
    const int src = (r - step + R) % R;
    const Tensor kb = half(here, 0, k.shape), vb = half(here, 1, k.shape);
    Span span{trace_now_ns(), 0};
    if (step == 0) {
      k::attention_forward(out, lse, q, kb, vb, ring_pos(r), ring_pos(src));
    } else {
      k::attention_forward(block_out_, block_lse_, q, kb, vb, ring_pos(r), ring_pos(src));
      k::attention_merge(out, lse, block_out_, block_lse_);
    }
    span.end_ns = trace_now_ns();
    spans_.push_back(span);
    recv.wait();
    send.wait();
  }
}

void ContextParallel::ring_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                                    const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out, const Tensor& lse) {
  if (!ring_) return k::attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
  const int R = ring_degree(), r = ring_->rank();
  const int next = (r + 1) % R, prev = (r + R - 1) % R;
  pack_kv(k, v);
  k::zero(dq);
  // Each block's dK/dV follows it around the ring: at step s this rank adds its share to
  // the partial sum received from the previous rank (which held the block at step s - 1)
  // and passes it on; after the last step the sum of all ranks arrives at the owner.
  Work dkv_send[2];  // per partial buffer
  for (int step = 0; step < R; ++step) {
    const Tensor& here = kv_[step % 2];
    Work recv, send, dkv_recv;
    if (step + 1 < R) {
      recv = ring_->recv(kv_[(step + 1) % 2], prev, kTagKv, true);
      send = ring_->send(here, next, kTagKv, true);
    }
    if (step > 0) dkv_recv = ring_->recv(dkv_in_, prev, kTagDkv, true);
    const int src = (r - step + R) % R;
    Tensor partial = dkv_[step % 2];
    dkv_send[step % 2].wait();  // sent two steps ago: free again
    k::zero(partial);
    k::attention_backward(dq, half(partial, 0, k.shape), half(partial, 1, k.shape), dout, q,
                          half(here, 0, k.shape), half(here, 1, k.shape), out, lse, ring_pos(r),
                          ring_pos(src), true);
    dkv_recv.wait();
    // (A planted bug for tests/python/layout_equivalence.py: the sum left out.)
    if (step > 0 && !bug_injected("cp-drop-remote-dkv")) k::add(partial, partial, dkv_in_);
    dkv_send[step % 2] = ring_->send(partial, next, kTagDkv, true);
    recv.wait();
    send.wait();
  }
  // The sum for this rank's own block comes back from the previous rank.
  ring_->recv(dkv_in_, prev, kTagDkv);
  for (Work& w : dkv_send) w.wait();
  copy(dk, half(dkv_in_, 0, k.shape));
  copy(dv, half(dkv_in_, 1, k.shape));
}

}  // namespace pentad::parallel
