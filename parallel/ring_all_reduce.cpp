// A sum all-reduce (Communicator::set_ring_all_reduce) and a sum reduce-scatter with uneven
// blocks (Communicator::reduce_scatter_v, always: ZeRO's gradient buckets; RingReduceScatter
// below) of f32 host memory as pentad's own ring over send/recv, so that every transfer has a
// known peer: the send and the receive of each leg are timed and added to this rank's row of
// the link matrix (parallel/activity.h). MPI's own collectives hide which peer they waited
// for; a slow link is then a slow rank to everyone.
//
// The all-reduce: n ranks, buf cut into n chunks (chunk c: elements [numel c / n,
// numel (c+1) / n)). Rank i sends to i+1 and receives from i-1 only:
//   reduce-scatter, legs s = 0..n-2: send chunk (i - s), receive chunk (i - s - 1) and add
//     it into buf; afterwards rank i holds the sum of chunk (i + 1);
//   all-gather, legs s = 0..n-2: send chunk (i + 1 - s), receive chunk (i - s) into buf.
// Chunk c is summed in ring order starting at rank c whatever the timing, and every rank
// copies the same bits in the all-gather, so results are deterministic and identical on all
// ranks (though not bitwise those of MPI's all-reduce, whose order differs).
//
// The Work advances leg by leg inside test() and wait(): like MPI without a progress
// thread, a ring moves only while its owner polls it. Legs go through the communicator's
// injection (comm_injection.cpp), so a slow link delays exactly the legs that cross it.
#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "parallel/activity.h"
#include "parallel/backend.h"
#include "parallel/comm.h"

namespace pentad::parallel {

// Tags of ring legs: one per ring collective in flight (sequence number mod kTagSpan), so
// that legs of two overlapping ones between the same pair never match each other's.
constexpr int kRingTagBase = 16384, kTagSpan = 16383;

// The legs of a ring: each sends one piece to the right neighbour and receives one from the
// left, both posted together; a leg's receipt is handled (leg_done) once both halves are
// done, then the next leg is posted. Subclasses say what each leg moves.
class RingWork : public WorkImpl {
 public:
  bool test() override {
    while (leg_ < legs_) {
      if (!send_done_ && send_->test()) {
        send_done_ = true;
        activity_link_sample(right_world_, true, send_bytes_,
                             1e-9 * double(trace_now_ns() - posted_ns_));
      }
      if (!recv_done_ && recv_->test()) {
        recv_done_ = true;
        activity_link_sample(left_world_, false, recv_bytes_,
                             1e-9 * double(trace_now_ns() - posted_ns_));
      }
      if (!send_done_ || !recv_done_) return false;
      leg_done(leg_);
      ++leg_;
      if (leg_ < legs_) post_leg();
    }
    return true;
  }
  void wait() override {
    while (!test()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }

 protected:
  // The tag is the collective's sequence number's (the trace ticket just taken).
  RingWork(Communicator& comm, int legs)
      : comm_(comm),
        tag_(kRingTagBase + int((comm.next_seq_ - 1) % uint64_t(kTagSpan))),
        legs_(legs),
        n_(comm.size()),
        me_(comm.rank()) {
    right_world_ = trace_channel_member(comm.trace_, (me_ + 1) % n_);
    left_world_ = trace_channel_member(comm.trace_, (me_ - 1 + n_) % n_);
  }
  void start() {  // by the subclass's constructor, once its buffers exist
    if (legs_ > 0) post_leg();
  }
  // Leg `leg`: the f32 elements sent to the right and the buffer receiving from the left.
  virtual std::pair<Tensor, Tensor> leg_buffers(int leg) = 0;
  virtual void leg_done(int leg) = 0;
  int chunk(int k) const { return ((k % n_) + n_) % n_; }

  Communicator& comm_;
  const int tag_, legs_, n_, me_;

 private:
  void post_leg() {
    const auto [out, in] = leg_buffers(leg_);
    std::vector<P2POp> ops{P2POp{true, out, (me_ + 1) % n_, tag_},
                           P2POp{false, in, (me_ - 1 + n_) % n_, tag_}};
    send_bytes_ = int64_t(out.bytes());
    recv_bytes_ = int64_t(in.bytes());
    posted_ns_ = trace_now_ns();
    std::vector<std::unique_ptr<WorkImpl>> impls = comm_.post_p2p_delayed(ops);
    send_ = std::move(impls.at(0));
    recv_ = std::move(impls.at(1));
    send_done_ = recv_done_ = false;
  }

  int leg_ = 0, right_world_ = -1, left_world_ = -1;
  std::unique_ptr<WorkImpl> send_, recv_;
  bool send_done_ = false, recv_done_ = false;
  int64_t send_bytes_ = 0, recv_bytes_ = 0, posted_ns_ = 0;
};

static Tensor f32_span(float* data, int64_t count) {
  return view_of(data, Shape{count}, DType::F32);
}

class RingAllReduce final : public RingWork {
 public:
  RingAllReduce(Communicator& comm, Tensor buf) : RingWork(comm, 2 * (comm.size() - 1)), buf_(buf) {
    int64_t largest = 0;
    for (int c = 0; c < n_; ++c) largest = std::max(largest, end(c) - begin(c));
    scratch_.resize(size_t(largest));
    start();
  }

 private:
  int64_t begin(int c) const { return buf_.numel() * c / n_; }
  int64_t end(int c) const { return buf_.numel() * (c + 1) / n_; }
  float* at(int c) const { return buf_.f32() + begin(c); }

  std::pair<Tensor, Tensor> leg_buffers(int leg) override {
    const bool reducing = leg < n_ - 1;
    const int s = reducing ? leg : leg - (n_ - 1);
    const int out = reducing ? chunk(me_ - s) : chunk(me_ + 1 - s);
    in_ = reducing ? chunk(me_ - s - 1) : chunk(me_ - s);
    return {f32_span(at(out), end(out) - begin(out)),
            f32_span(reducing ? scratch_.data() : at(in_), end(in_) - begin(in_))};
  }
  void leg_done(int leg) override {
    if (leg >= n_ - 1) return;  // all-gather legs land in place
    float* sum = at(in_);
    const int64_t count = end(in_) - begin(in_);
    for (int64_t e = 0; e < count; ++e) sum[e] += scratch_[size_t(e)];
  }

  Tensor buf_;
  int in_ = 0;                  // the chunk the leg in flight receives
  std::vector<float> scratch_;  // a received chunk before it is added (reduce-scatter)
};

// A sum reduce-scatter of f32 host memory with uneven blocks (block c: counts[c] elements, in
// rank order) as the all-reduce's first n-1 legs, shifted so that rank i ends with block i:
// leg s sends the partial sum of block (i - s - 1) and receives that of block (i - s - 2),
// to which it adds its own. Blocks longer than kPiece go around in slices of kPiece, one
// slice's n-1 legs after the other, so that the partial sums travel through two buffers of
// kPiece at most whatever the bucket: no rank holds more than that besides in and out (Open
// MPI's MPI_Ireduce_scatter reduces whole buffers up a binomial tree, and the tree's inner
// ranks hold scratch copies of every pending one). `in` is only read.
class RingReduceScatter final : public RingWork {
 public:
  static constexpr int64_t kPiece = int64_t{1} << 20;  // elements: 4 MiB

  RingReduceScatter(Communicator& comm, Tensor out, const Tensor& in,
                    std::span<const int64_t> counts)
      : RingWork(comm, slices(counts) * (comm.size() - 1)), out_(out), in_(in) {
    int64_t at = 0;
    for (int64_t c : counts) {
      offset_.push_back(at);
      count_.push_back(c);
      at += c;
    }
    const int64_t piece = std::min(kPiece, *std::max_element(counts.begin(), counts.end()));
    partial_.resize(size_t(piece));
    received_.resize(size_t(piece));
    start();
  }

 private:
  static int slices(std::span<const int64_t> counts) {
    const int64_t largest = *std::max_element(counts.begin(), counts.end());
    return int(std::max<int64_t>(1, (largest + kPiece - 1) / kPiece));
  }
  // Slice k of block c: elements [first, first + length) of the block.
  int64_t first(int c, int k) const { return std::min(count_[size_t(c)], k * kPiece); }
  int64_t length(int c, int k) const {
    return std::min(count_[size_t(c)], (k + 1) * kPiece) - first(c, k);
  }
  const float* own(int c, int k) const { return in_.f32() + offset_[size_t(c)] + first(c, k); }

  std::pair<Tensor, Tensor> leg_buffers(int leg) override {
    const int k = leg / (n_ - 1), s = leg % (n_ - 1);
    const int out = chunk(me_ - s - 1), in = chunk(me_ - s - 2);
    // A slice's first leg sends this rank's own part as it is; later legs the partial sum
    // leg_done made.
    float* from = s == 0 ? const_cast<float*>(own(out, k)) : partial_.data();
    return {f32_span(from, length(out, k)), f32_span(received_.data(), length(in, k))};
  }
  void leg_done(int leg) override {
    const int k = leg / (n_ - 1), s = leg % (n_ - 1);
    const int c = chunk(me_ - s - 2);  // the block whose slice k just came in
    float* sum = s == n_ - 2 ? out_.f32() + first(c, k) : partial_.data();  // last: c is mine
    const float* mine = own(c, k);
    for (int64_t e = 0; e < length(c, k); ++e) sum[e] = received_[size_t(e)] + mine[e];
  }

  Tensor out_, in_;
  std::vector<int64_t> offset_, count_;
  std::vector<float> partial_, received_;  // the partial sum to send on, the one come in
};

std::unique_ptr<WorkImpl> Communicator::post_ring_all_reduce(Tensor buf) {
  return std::make_unique<RingAllReduce>(*this, buf);
}

std::unique_ptr<WorkImpl> Communicator::post_ring_reduce_scatter(Tensor out, const Tensor& in,
                                                                 std::span<const int64_t> counts) {
  return std::make_unique<RingReduceScatter>(*this, out, in, counts);
}

}  // namespace pentad::parallel
