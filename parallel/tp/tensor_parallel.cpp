#include "parallel/tp/tensor_parallel.h"

namespace pentad::parallel {

TensorParallel::TensorParallel(Communicator* group, bool sequence_parallel)
    : group_(group && group->size() > 1 ? group : nullptr),
      sequence_parallel_(sequence_parallel && group_ != nullptr) {}

void TensorParallel::f_forward(Tensor full, const Tensor& local) {
  if (sequence_parallel_) group_->all_gather(full, local);
}

void TensorParallel::f_backward(Tensor local, Tensor full) {
  if (!group_) return;
  if (sequence_parallel_)
    group_->reduce_scatter(local, full);
  else
    group_->all_reduce(full);
}

void TensorParallel::g_forward(Tensor local, Tensor full) {
  if (!group_) return;
  if (sequence_parallel_)
    group_->reduce_scatter(local, full);
  else
    group_->all_reduce(full);
}

void TensorParallel::g_backward(Tensor full, const Tensor& local) {
  if (sequence_parallel_) group_->all_gather(full, local);
}

void TensorParallel::all_reduce(Tensor buf, ReduceOp op) {
  if (group_) group_->all_reduce(buf, op);
}

}  // namespace pentad::parallel
