#pragma once
// Data-parallel gradient reduction in buckets, overlapped with backward, and ZeRO's
// sharding of it. Buckets are contiguous ranges of the gradient arena, cut at parameter
// boundaries from the end of the arena (the order backward finishes parameters). The model
// reports "everything from this offset to the end is final"; each bucket then wholly inside
// that range starts a non-blocking collective at once, and pending ones are polled so MPI
// makes progress while the next layer's backward computes.
//
// ZeRO (stage >= 1): each bucket is cut into one contiguous share per rank, at row
// boundaries of its parameters (so that a share of a parameter is a box of it, which a
// checkpoint can name), and reduce-scattered: rank r receives the sum of share r into its
// compact gradient buffer, laid out as shard() says. The optimizer updates the parameters of
// its shares only; gather_params() all-gathers every bucket in place afterwards.
//   stage 1: the full gradient arena stays; buckets reduce after the last micro-batch.
//   stage 2: buckets reduce after every micro-batch, adding into the compact buffer (after
//            the first micro-batch, this rank's shares are added into its part of the bucket
//            before the reduce-scatter writes them back: no second buffer of shares). The
//            gradient arena is reserved, not backed (Placement::sparse_grads): a bucket's
//            gradients get a zeroed buffer of their own at the first write of backward
//            (ParamStore's gradient source asks grads_source()), which goes as soon as the
//            reduction is done, at most kInFlight buckets pending: the full-size gradients
//            are never all in memory.
//   stage 3: as stage 2, with one bucket per unit (a layer, the embedding, the head: the
//            caller's `unit` key), and the parameters sharded too: the parameter arena backs
//            this rank's shares only (Placement::sparse_params; the optimizer updates them
//            there). acquire() fills a buffer of the unit's own (this rank's share copied in,
//            the others' all-gathered) that the model reads through ParamStore's homes until
//            release(). With the shares kept elsewhere (the constructor's fetch;
//            ZeRO-Infinity: on NVMe) the arena backs nothing at all, and each share is read
//            straight into its unit's buffer instead. When the model computes
//            from a bf16 copy, acquire() derives the unit's copy, a buffer too, from the
//            gathered fp32 values once per gather. fp32 is gathered rather than bf16 (half
//            the bytes) because the arena's fp32 values are what checkpoints and the NVMe
//            path read; on CUDA the conversion is one kernel on the compute stream after the
//            gather's event, so the host does not wait.
// The same on the CPU and on CUDA, where a reserved arena is virtual memory with only the
// shares mapped: the memory of stages 2 and 3 really goes on a GPU too. The buffers come from
// a pool that keeps what it handed out (on CUDA nothing is freed, so nothing waits for the
// device; on the host the pages go back to the system). Takes follow the model's hooks and
// gives come at points every step reaches alike (a release, a bucket pushed out of the
// kInFlight window, finish()), never when a test() happens to find a reduction done, so
// every step asks the pool the same; each take gets the buffer the same take of the step
// before had, so the pool makes its buffers in the first step only (buffers_made()).
// How many units are gathered at once is the caller's budget (parallel.zero_live_units,
// train/parallelize.cpp), read back through units_whole().
// Stream rule on CUDA, no host wait: the compute stream orders every reuse. A buffer goes
// back to the pool once all its use is on the compute stream or ordered before it: the
// model's kernels run there, and the collective that filled or read it was waited for
// (Work::wait(): cudaStreamWaitEvent on the collective's event, the host goes on) or found
// done by test(). Its next user queues its first work on the compute stream (this rank's
// share copied in, zeros, kernels) or on the communicator's stream, which the communicator
// makes wait for an event recorded on the compute stream as each collective is posted. The
// one host wait left is a buffer the pool makes (cudaMalloc): in the first step only.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/params.h"
#include "parallel/comm.h"

namespace pentad::parallel {

class GradReducer {
 public:
  using Filter = std::function<bool(const ParamSpec&)>;
  using Unit = std::function<std::string(const ParamSpec&)>;
  // group: the dp (x cp) group; gradients are summed (callers scale the loss by 1/dp).
  // include: the parameters this group reduces (all when empty); buckets never span one
  // that is left out (MoE experts reduce over their own group, edp).
  // isolate: parameters that get a bucket of their own, so that every rank holding one
  // (the tied embedding on the first and last pipeline stages) cuts its shares alike.
  // unit: buckets never hold parameters of two keys (a pipeline stage's chunks at stage 2,
  // each reduced apart); at stage 3 parameters with the same key, adjacent in the arena,
  // form one bucket whatever its size.
  // fetch (stage 3; ZeRO-Infinity): this rank's shares live outside the parameter arena,
  // which then backs none of them. fetch(shard, count, into) starts reading elements
  // [shard, shard + count) of the compact layout (where the bucket's share sits in shard())
  // to `into`, the unit's buffer, and returns what waits for them. prefetch() and acquire()
  // wait for the read before the all-gather (it sends from there). On a device the arrival
  // may leave the share's copy into the buffer queued on the compute stream (trainer: the
  // NVMe read lands in page-locked staging first): the all-gather is ordered behind it,
  // since the communicator's stream waits for the compute stream.
  using Arrival = std::function<void()>;
  using FetchShare = std::function<Arrival(int64_t shard, int64_t count, float* into)>;
  GradReducer(Communicator& group, ParamStore& params, size_t bucket_bytes, int zero_stage = 0,
              const Filter& include = {}, const Filter& isolate = {}, const Unit& unit = {},
              FetchShare fetch = {});
  // Waits for every bucket's pending operation before the buffers it reads or writes go
  // (an error can leave some pending).
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Gradients at element offsets [offset, end) are final for this micro-batch (the step's
  // last one, below stage 2).
  void ready_from(int64_t offset);
  // Starts every bucket not yet started and waits for all of them.
  void finish();
  // Before a step's first reduction. At stages 2 and 3 each bucket's first reduction of the
  // step then overwrites its shares and the later ones (later micro-batches) add into them.
  void begin_step();
  // Pipelines at stages 2 and 3: a stage's chunks finish their gradients in turn, one
  // micro-batch's at a time, and each chunk's are reduced after each of its backward passes
  // (train/grad_sync.h). While a window is set, ready_from() and finish() see only the
  // buckets inside arena elements [begin, end) (one chunk's: `unit` cut the buckets there),
  // and finish() leaves the pool's count of takes for the step's end (clear_window()).
  void set_window(int64_t begin, int64_t end);
  void clear_window();

  // Stage >= 1: which part of the arena this rank's optimizer owns, its reduced gradients
  // (compact, shard().numel elements), and the all-gather of the updated parameters.
  const StateShard& shard() const { return shard_; }
  Tensor shard_grads() const;
  // ZeRO with MoE: the reduced shares live in `buffer` (shard().numel elements of the one
  // compact buffer the optimizer reads, which holds the dense and the expert reducer's shares
  // side by side) instead of a buffer of this reducer's own, which goes.
  void place_shares(const Tensor& buffer);
  void gather_params();
  // The reduced gradients back in the full gradient arena on every rank (the first step's
  // gradient dump compares them with other layouts'); sparse gradients: in buffers of their
  // own, readable through ParamStore::grad() until drop_gathered_grads().
  void gather_grads();
  void drop_gathered_grads();
  size_t pool_bytes() const;  // sparse arenas: the buffers the pool holds, in use or not
  // The buffers the pool has made since construction (on CUDA each a cudaMalloc, which
  // waits): the takes and gives of a step come in the same order every step, so after the
  // first step this stops growing (zero3_memory_test counts it).
  int64_t buffers_made() const { return buffers_made_; }

  // Stage 3: the bucket holding arena element `offset`; acquire() makes the buckets whole
  // on this rank (all-gathers those not already, each acquire counted), prefetch() starts
  // a bucket's all-gather without waiting, release() discards a bucket's other shares once
  // its last acquirer is done. release_all() at start-up and after a load.
  int bucket_of(int64_t offset) const;
  void acquire(int bucket);
  void prefetch(int bucket);
  void release(int bucket);
  void release_all();
  int buckets_count() const { return int(buckets_.size()); }
  // Stage 3: the buckets whole now (gathered, or with a gather on its way), which the
  // caller's live budget bounds (train/parallelize.cpp): prefetch() and acquire() add one
  // each, release() of its last acquirer takes it away.
  int units_whole() const;
  // Shares kept elsewhere: starts reading the share of a unit ahead of its prefetch(), so
  // that the read overlaps the compute of the unit before.
  void read_ahead(int bucket);

  // While set, reduced(at, count) is called as each bucket's reduction is done: elements
  // [at, at + count) of the reduced gradients are final (the compact shares' offsets with
  // ZeRO, the gradient arena's without). The trainer sets it for a step's last reduction
  // only: host-offloaded AdamW brings them down then, during backward.
  using Reduced = std::function<void(int64_t at, int64_t count)>;
  void on_reduced(Reduced reduced) { reduced_ = std::move(reduced); }

  int zero_stage() const { return stage_; }
  static constexpr size_t kInFlight = 2;  // stage 2: buckets of full gradients at most pending
  int64_t largest_bucket() const;         // elements
  // Bucket b's elements, and those of them in this rank's share (the memory plan's count).
  int64_t bucket_elements(int b) const;
  int64_t bucket_share(int b) const;
  size_t buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;   // element offsets in the gradient arena
    std::vector<int64_t> counts;  // ZeRO: each rank's share, in rank order
    int64_t shard = 0;            // ZeRO: where this rank's share sits in the compact buffer
    Work work;
    bool done = false;      // finished and, at stage 2, discarded
    bool summed = false;    // stages 2 and 3: reduced into the shares since begin_step()
    bool reported = false;  // finished and reported to on_reduced()'s callback
    // Stage 3: the parameters' all-gather, whether they are whole here, and the acquirers.
    Work gather;
    bool whole = true;
    int users = 0;
    Arrival arrival;    // shares kept elsewhere: this rank's share on its way (empty: not)
    bool fresh = true;  // the compute copy holds this gather's values (set by acquire)
    // Sparse arenas: the unit's gathered values and their compute copy, and the bucket's
    // gradients, each element `begin` at the buffer's start (empty: none now).
    Arena values, compute, grads;
  };
  int64_t share_begin(const Bucket& b) const;  // this rank's share in the arena
  void cut_shares(Bucket& b, const ParamStore& params) const;
  void start(Bucket& b);
  void report(Bucket& b);    // its reduction is done: on_reduced()'s call
  void complete(Bucket& b);  // after its work is done: reported, and its buffer given back
  // All-gathers every bucket in place; at(b) is where element b.begin of it lies.
  void gather(const std::function<float*(Bucket&)>& at);
  void refresh_compute_copy(Bucket& b);  // stage 3, bf16 models: after the gather is waited for
  // Sparse arenas: the pool's buffers, and a bucket's gradient buffer (zeros) placed as
  // their home; grads_source() is ParamStore's gradient source for this reducer's buckets.
  Arena take(size_t bytes, const char* what);
  Arena make_buffer(size_t bytes, const char* what);
  void give(Arena& buffer);
  void home_grads(Bucket& b);
  void drop_grads(Bucket& b);
  bool grads_source(int id);
  float* values_at(Bucket& b);  // stage 3: the gather's buffer (taken here if need be)

  Communicator& group_;
  ParamStore& params_;
  int stage_ = 0;
  Device device_ = Device::CPU;  // where the gradients live
  std::vector<Bucket> buckets_;  // from the end of the arena towards its start
  size_t next_ = 0;              // first bucket not started
  size_t first_ = 0, last_ = 0;  // the window's buckets: [first_, last_) (all without one)
  bool windowed_ = false;
  StateShard shard_;
  Arena shard_grads_;        // ZeRO: the reduced shares
  float* shares_ = nullptr;  // the reduced shares: shard_grads_, or place_shares()'
  FetchShare fetch_;         // stage 3: where this rank's shares come from (empty: they stay)
  Reduced reduced_;
  std::vector<Arena> pool_;  // stages 2, 3: buffers not in use
  // The pool's takes since finish(), and the buffer (its base) each n-th take last had.
  size_t takes_ = 0;
  std::vector<void*> took_;
  int64_t buffers_made_ = 0;
};

}  // namespace pentad::parallel
