// A sum all-reduce of f32 host memory as pentad's own ring over send/recv (Communicator::
// set_ring_all_reduce), so that every transfer has a known peer: the send and the receive of
// each leg are timed and added to this rank's row of the link matrix (parallel/activity.h). MPI's
// own all-reduce hides which peer it waited for; a slow link is then a slow rank to everyone.
//
// n ranks, buf cut into n chunks (chunk c: elements [numel c / n, numel (c+1) / n)). Rank i
// sends to i+1 and receives from i-1 only:
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
#include <chrono>
#include <thread>
#include <vector>

#include "parallel/activity.h"
#include "parallel/backend.h"
#include "parallel/comm.h"

namespace pentad::parallel {

// Tags of ring legs: one per all-reduce in flight (sequence number mod kTagSpan), so that
// legs of two overlapping all-reduces between the same pair never match each other's.
constexpr int kRingTagBase = 16384, kTagSpan = 16383;

class RingAllReduce final : public WorkImpl {
 public:
  RingAllReduce(Communicator& comm, Tensor buf, int tag)
      : comm_(comm), buf_(buf), tag_(tag), n_(comm.size()), me_(comm.rank()) {
    right_world_ = trace_channel_member(comm.trace_, (me_ + 1) % n_);
    left_world_ = trace_channel_member(comm.trace_, (me_ - 1 + n_) % n_);
    int64_t largest = 0;
    for (int c = 0; c < n_; ++c) largest = std::max(largest, end(c) - begin(c));
    scratch_.resize(size_t(largest));
    post_leg();
  }
  bool test() override {
    while (leg_ < 2 * (n_ - 1)) {
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
      if (leg_ < n_ - 1) add_received();
      ++leg_;
      if (leg_ < 2 * (n_ - 1)) post_leg();
    }
    return true;
  }
  void wait() override {
    while (!test()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }

 private:
  int64_t begin(int c) const { return buf_.numel() * c / n_; }
  int64_t end(int c) const { return buf_.numel() * (c + 1) / n_; }
  int chunk(int k) const { return ((k % n_) + n_) % n_; }
  float* at(int c) const { return buf_.f32() + begin(c); }

  void post_leg() {
    const bool reducing = leg_ < n_ - 1;
    const int s = reducing ? leg_ : leg_ - (n_ - 1);
    const int out = reducing ? chunk(me_ - s) : chunk(me_ + 1 - s);
    in_ = reducing ? chunk(me_ - s - 1) : chunk(me_ - s);
    const int64_t out_n = end(out) - begin(out), in_n = end(in_) - begin(in_);
    float* into = reducing ? scratch_.data() : at(in_);
    std::vector<P2POp> ops{
        P2POp{true, view_of(at(out), Shape{out_n}, DType::F32), (me_ + 1) % n_, tag_},
        P2POp{false, view_of(into, Shape{in_n}, DType::F32), (me_ - 1 + n_) % n_, tag_}};
    send_bytes_ = out_n * int64_t(sizeof(float));
    recv_bytes_ = in_n * int64_t(sizeof(float));
    posted_ns_ = trace_now_ns();
    std::vector<std::unique_ptr<WorkImpl>> impls = comm_.post_p2p_delayed(ops);
    send_ = std::move(impls.at(0));
    recv_ = std::move(impls.at(1));
    send_done_ = recv_done_ = false;
  }
  void add_received() {
    float* sum = at(in_);
    const int64_t count = end(in_) - begin(in_);
    for (int64_t e = 0; e < count; ++e) sum[e] += scratch_[size_t(e)];
  }

  Communicator& comm_;
  Tensor buf_;
  int tag_, n_, me_, right_world_ = -1, left_world_ = -1;
  int leg_ = 0, in_ = 0;        // the leg in flight, and the chunk it receives
  std::vector<float> scratch_;  // a received chunk before it is added (reduce-scatter)
  std::unique_ptr<WorkImpl> send_, recv_;
  bool send_done_ = false, recv_done_ = false;
  int64_t send_bytes_ = 0, recv_bytes_ = 0, posted_ns_ = 0;
};

std::unique_ptr<WorkImpl> Communicator::post_ring_all_reduce(Tensor buf) {
  const int tag = kRingTagBase + int((next_seq_ - 1) % uint64_t(kTagSpan));
  return std::make_unique<RingAllReduce>(*this, buf, tag);
}

}  // namespace pentad::parallel
