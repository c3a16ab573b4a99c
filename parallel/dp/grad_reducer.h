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
//   stage 2: buckets reduce after every micro-batch, adding into the compact buffer, and
//            each bucket's part of the full arena is discarded (zeros, pages returned) as
//            soon as its reduction is done, at most kInFlight buckets pending: the full-size
//            gradients are never all resident.
//   stage 3: as stage 2, with one bucket per unit (a layer, the embedding, the head: the
//            caller's `unit` key), and the parameters sharded too: this rank's shares stay
//            resident (the optimizer updates them there), the rest of a unit is all-gathered
//            by acquire() before the model reads it and discarded by release() after. With
//            keep_shares_elsewhere() (ZeRO-Infinity: the shares on NVMe) not even those: a
//            unit's share is read back before its all-gather and dropped with the rest.
//            When the model computes from a bf16 copy (ParamStore::compute_copy), acquire()
//            re-derives the unit's part of it from the gathered fp32 values once per gather:
//            only this rank's share was updated by the optimizer, so the rest of the copy is
//            stale until then. fp32 is gathered rather than bf16 (half the bytes) because the
//            arena's fp32 values are what checkpoints, gradient dumps and the NVMe path read;
//            on CUDA the conversion is one kernel on the compute stream after the gather's
//            event, so the host does not wait.
#include <cstdint>
#include <functional>
#include <string>
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
  // unit (stage 3): parameters with the same key, adjacent in the arena, form one bucket.
  GradReducer(Communicator& group, ParamStore& params, size_t bucket_bytes, int zero_stage = 0,
              const Filter& include = {}, const Filter& isolate = {}, const Unit& unit = {});

  // Gradients at element offsets [offset, end) are final for this micro-batch (the step's
  // last one, below stage 2).
  void ready_from(int64_t offset);
  // Starts every bucket not yet started and waits for all of them.
  void finish();
  // Stage 2, micro-batches after the first of a step: reductions add into the compact
  // buffer instead of overwriting it.
  void set_accumulate(bool accumulate) { accumulate_ = accumulate; }

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
  // gradient dump compares them with other layouts').
  void gather_grads();

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
  // Stage 3, this rank's shares kept outside the arena between uses: fetch(shard, count,
  // into) starts reading elements [shard, shard + count) of the compact layout (where the
  // bucket's share sits in shard()) into the arena at `into`, and returns what waits for
  // them. prefetch() and acquire() wait for the read before the all-gather (it sends from
  // there); read_ahead() only starts it, a unit before its prefetch, so that the read
  // overlaps the compute of the unit before. release() drops this rank's share too.
  // On a device the arrival may leave the share's copy into the arena queued on the compute
  // stream (trainer: the NVMe read lands in page-locked staging first): the all-gather is
  // ordered behind it, since the communicator's stream waits for the compute stream.
  using Arrival = std::function<void()>;
  using FetchShare = std::function<Arrival(int64_t shard, int64_t count, float* into)>;
  void keep_shares_elsewhere(FetchShare fetch);
  void read_ahead(int bucket);

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
    bool done = false;  // finished and, at stage 2, discarded
    // Stage 3: the parameters' all-gather, whether they are whole here, and the acquirers.
    Work gather;
    bool whole = true;
    int users = 0;
    Arrival arrival;    // shares kept elsewhere: this rank's share on its way (empty: not)
    bool fresh = true;  // the compute copy holds this gather's values (set by acquire)
  };
  int64_t share_begin(const Bucket& b) const;  // this rank's share in the arena
  void cut_shares(Bucket& b, const ParamStore& params) const;
  void start(Bucket& b);
  void complete(Bucket& b);   // after its work is done
  void gather(float* arena);  // all-gathers every bucket of an arena laid out like params
  void refresh_compute_copy(Bucket& b);  // stage 3, bf16 models: after the gather is waited for

  Communicator& group_;
  ParamStore& params_;
  int stage_ = 0;
  Device device_ = Device::CPU;  // where the gradients live
  std::vector<Bucket> buckets_;  // from the end of the arena towards its start
  size_t next_ = 0;              // first bucket not started
  StateShard shard_;
  Arena shard_grads_, incoming_;  // ZeRO: reduced shares; stage 2's next micro-batch's
  float* shares_ = nullptr;       // the reduced shares: shard_grads_, or place_shares()'
  bool accumulate_ = false;
  FetchShare fetch_;  // stage 3: where this rank's shares come from (empty: they stay)
};

}  // namespace pentad::parallel
