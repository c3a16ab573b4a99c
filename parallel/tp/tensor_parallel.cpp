#include "parallel/tp/tensor_parallel.h"

#include "core/check.h"
#include "core/device_memory.h"

namespace pentad::parallel {

TensorParallel::TensorParallel(Communicator* group, bool sequence_parallel)
    : group_(group && group->size() > 1 ? group : nullptr),
      sequence_parallel_(sequence_parallel && group_ != nullptr) {}

TensorParallel::TensorParallel(Communicator* all, Communicator* heads, Communicator* hidden,
                               bool sequence_parallel)
    : TensorParallel(all, sequence_parallel) {
  PENTAD_CHECK(all && heads && hidden && heads->size() * hidden->size() == all->size(),
               "2D tensor parallelism: groups of {} x {} ranks for {}", heads ? heads->size() : 0,
               hidden ? hidden->size() : 0, all ? all->size() : 0);
  if (hidden->size() > 1) {
    heads_ = heads;
    hidden_ = hidden;
  }
}

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

Tensor TensorParallel::scratch(int which, Shape shape, const Tensor& like) {
  const size_t bytes = Arena::aligned(size_t(shape.numel()) * dtype_bytes(like.dtype));
  if (bytes > scratch_half_ || scratch_.device() != like.device) {
    scratch_ = Arena("tensor parallel (2D)", 2 * bytes, like.device);
    scratch_half_ = bytes;
  }
  Tensor t = view_of(static_cast<char*>(scratch_.base()) + size_t(which) * scratch_half_, shape,
                     like.dtype, like.device);
  return t;
}

// Columns [j * w, (j + 1) * w) of rows (n, C) into (n, w), and back.
static void take_columns(Tensor dst, const Tensor& src, int64_t j) {
  const size_t es = dtype_bytes(src.dtype), w = size_t(dst.dim(1)) * es;
  copy_2d(dst.data, w, static_cast<const char*>(src.data) + size_t(j) * w, size_t(src.dim(1)) * es,
          w, size_t(src.dim(0)), src.device);
}
static void put_columns(Tensor dst, const Tensor& src, int64_t j) {
  const size_t es = dtype_bytes(src.dtype), w = size_t(src.dim(1)) * es;
  copy_2d(static_cast<char*>(dst.data) + size_t(j) * w, size_t(dst.dim(1)) * es, src.data, w, w,
          size_t(src.dim(0)), src.device);
}

void TensorParallel::gather_hidden(Tensor full_j, const Tensor& local) {
  if (!hidden_) return f_forward(full_j, local);
  const int64_t d2 = hidden_->size(), j = hidden_->rank(), w = full_j.dim(1);
  PENTAD_CHECK(local.dim(1) == w * d2, "gather_hidden: local {} for columns {}", local.shape.str(),
               full_j.shape.str());
  if (!sequence_parallel_) return take_columns(full_j, local, j);
  // Block j' of what goes to hidden rank j' is this rank's rows, columns j'; what comes
  // back is every (i, j') rank's rows, columns j: the d2 row blocks of heads block i, in
  // order. The heads ranks then gather their blocks.
  const int64_t rows = local.dim(0);
  Tensor send = scratch(0, Shape{d2 * rows, w}, local),
         recv = scratch(1, Shape{d2 * rows, w}, local);
  for (int64_t k = 0; k < d2; ++k) take_columns(send.rows(k * rows, rows), local, k);
  hidden_->all_to_all(recv, send);
  if (heads_->size() > 1)
    heads_->all_gather(full_j, recv);
  else
    copy(full_j, recv);
}

void TensorParallel::reduce_hidden(Tensor local, Tensor partial_j) {
  if (!hidden_) return g_forward(local, partial_j);
  const int64_t d2 = hidden_->size(), n = partial_j.dim(0), w = partial_j.dim(1);
  PENTAD_CHECK(local.dim(1) == w * d2, "reduce_hidden: local {} for columns {}", local.shape.str(),
               partial_j.shape.str());
  if (!sequence_parallel_) {
    if (heads_->size() > 1) heads_->all_reduce(partial_j);
    Tensor all = scratch(0, Shape{d2 * n, w}, partial_j);
    hidden_->all_gather(all, partial_j);
    for (int64_t k = 0; k < d2; ++k) put_columns(local, all.rows(k * n, n), k);
    return;
  }
  // Summed over the heads ranks, heads block i of the rows stays here; its d2 row blocks go
  // to the hidden ranks that hold them, each coming back with the columns of its sender.
  const int64_t rows = local.dim(0);
  Tensor mine = partial_j;
  if (heads_->size() > 1) {
    mine = scratch(0, Shape{n / heads_->size(), w}, partial_j);
    heads_->reduce_scatter(mine, partial_j);
  }
  Tensor recv = scratch(1, Shape{d2 * rows, w}, partial_j);
  hidden_->all_to_all(recv, mine);
  for (int64_t k = 0; k < d2; ++k) put_columns(local, recv.rows(k * rows, rows), k);
}

void TensorParallel::all_reduce_hidden(Tensor buf, bool async) {
  if (!hidden_) return;
  if (async)
    pending_.push_back(hidden_->all_reduce(buf, ReduceOp::Sum, true));
  else
    hidden_->all_reduce(buf);
}

void TensorParallel::wait_hidden() {
  for (Work& w : pending_) w.wait();
  pending_.clear();
}

void TensorParallel::all_reduce(Tensor buf, ReduceOp op) {
  if (group_) group_->all_reduce(buf, op);
}

}  // namespace pentad::parallel
