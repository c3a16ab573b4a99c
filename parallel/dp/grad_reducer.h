#pragma once
// Data-parallel gradient reduction in buckets, overlapped with backward. Buckets are
// contiguous ranges of the gradient arena, cut at parameter boundaries from the end of
// the arena (the order backward finishes parameters). The model reports "everything from
// this offset to the end is final"; each bucket then wholly inside that range starts a
// non-blocking all-reduce at once, and pending ones are polled so MPI makes progress
// while the next layer's backward computes.
#include <cstdint>
#include <functional>
#include <vector>

#include "core/params.h"
#include "parallel/comm.h"

namespace pentad::parallel {

class GradReducer {
 public:
  // group: the dp (x cp) group; gradients are summed (callers scale the loss by 1/dp).
  // include: the parameters this group reduces (all when empty); buckets never span one
  // that is left out (MoE experts reduce over their own group, edp).
  GradReducer(Communicator& group, const ParamStore& params, size_t bucket_bytes,
              const std::function<bool(const ParamSpec&)>& include = {});

  // Gradients at element offsets [offset, end) are final for this step.
  void ready_from(int64_t offset);
  // Starts every bucket not yet started and waits for all of them.
  void finish();

  size_t buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // element offsets in the gradient arena
    Work work;
  };
  Communicator& group_;
  float* grads_ = nullptr;
  Device device_ = Device::CPU;  // where the gradients live
  std::vector<Bucket> buckets_;  // from the end of the arena towards its start
  size_t next_ = 0;              // first bucket not started
};

}  // namespace pentad::parallel
