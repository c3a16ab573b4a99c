#include "parallel/dp/grad_reducer.h"

#include <algorithm>

namespace pentad::parallel {

GradReducer::GradReducer(Communicator& group, const ParamStore& params, size_t bucket_bytes,
                         const std::function<bool(const ParamSpec&)>& include)
    : group_(group), grads_(params.all_grads().f32()), device_(params.device()) {
  const auto& specs = params.specs();
  const int64_t bucket_elems =
      std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / sizeof(float)));
  int64_t end = params.numel(), begin = end;  // the open bucket
  for (size_t i = specs.size(); i-- > 0;) {
    const int64_t offset = static_cast<int64_t>(specs[i].offset);
    if (include && !include(specs[i])) {  // closes the open bucket below the one left out
      if (begin < end) buckets_.push_back(Bucket{begin, end, Work()});
      end = begin = offset;
      continue;
    }
    begin = offset;
    if (end - begin >= bucket_elems) {
      buckets_.push_back(Bucket{begin, end, Work()});
      end = begin;
    }
  }
  if (begin < end) buckets_.push_back(Bucket{begin, end, Work()});
}

void GradReducer::ready_from(int64_t offset) {
  while (next_ < buckets_.size() && buckets_[next_].begin >= offset) {
    Bucket& b = buckets_[next_++];
    if (&b == &buckets_.front() && bug_injected("dp-skip-last-bucket")) continue;
    b.work =
        group_.all_reduce(view_of(grads_ + b.begin, Shape{b.end - b.begin}, DType::F32, device_),
                          ReduceOp::Sum, /*async=*/true);
  }
  for (size_t i = 0; i < next_; ++i) buckets_[i].work.test();  // drive progress
}

void GradReducer::finish() {
  ready_from(0);
  for (Bucket& b : buckets_) b.work.wait();
  next_ = 0;
}

}  // namespace pentad::parallel
