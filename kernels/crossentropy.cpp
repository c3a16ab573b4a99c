// The doors of softmax cross-entropy fused with its gradient (kernels/ops.h): over whole
// rows of logits, and over logits sharded along the vocabulary (tensor parallel), whose three
// local phases the caller separates by two reductions.
#include "kernels/cpu/crossentropy.h"

#include "kernels/cpu/vocab_parallel.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/door.h"
#include "kernels/ops.h"

namespace pentad::kernels {

void crossentropy_forward_backward(Tensor losses, Tensor dlogits, const Tensor& logits,
                                   const Tensor& targets, float dloss) {
  const char* op = "crossentropy_forward_backward";
  const Call call =
      check_args(op, {{"logits", logits}}, {f32_on_cuda("losses", losses), {"dlogits", dlogits}},
                 {{"targets", targets}});
  const int64_t V = cols(logits), N = rows(logits);
  check_numel(op, {{"targets", targets}, {"losses", losses}}, N);
  check_matrix(op, {"dlogits", dlogits}, N, V);
  run(
      call,
      [&] { cuda::crossentropy_forward_backward(losses, dlogits, logits, targets, N, V, dloss); },
      [&]<typename T>(T) {
        check_indices(op, targets, V, "target");
        cpu::crossentropy_forward_backward<T>(ptr<T>(losses), ptr<T>(dlogits), ptr<T>(logits),
                                              ptr<int32_t>(targets), N, V, static_cast<T>(dloss));
      });
}

void vocab_parallel_ce_max(Tensor row_max, const Tensor& logits) {
  const char* op = "vocab_parallel_ce_max";
  const Call call = check_args(op, {f32_on_cuda("row_max", row_max), {"logits", logits}});
  const int64_t N = rows(logits), Vl = cols(logits);
  check_numel(op, {"row_max", row_max}, N);
  run(
      call, [&] { cuda::vocab_parallel_ce_max(row_max, logits, N, Vl); },
      [&]<typename T>(T) {
        cpu::vocab_parallel_ce_max<T>(ptr<T>(row_max), ptr<T>(logits), N, Vl);
      });
}

void vocab_parallel_ce_stats(Tensor stats, const Tensor& logits, const Tensor& row_max,
                             const Tensor& targets, int64_t vocab_start) {
  const char* op = "vocab_parallel_ce_stats";
  const Call call = check_args(
      op, {f32_on_cuda("stats", stats), {"logits", logits}, f32_on_cuda("row_max", row_max)}, {},
      {{"targets", targets}});
  const int64_t N = rows(logits), Vl = cols(logits);
  check_numel(op, {"stats", stats}, 2 * N);
  check_numel(op, {{"row_max", row_max}, {"targets", targets}}, N);
  run(
      call,
      [&] { cuda::vocab_parallel_ce_stats(stats, logits, row_max, targets, N, Vl, vocab_start); },
      [&]<typename T>(T) {
        cpu::vocab_parallel_ce_stats<T>(ptr<T>(stats), ptr<T>(logits), ptr<T>(row_max),
                                        ptr<int32_t>(targets), N, Vl, vocab_start);
      });
}

void vocab_parallel_ce_finish(Tensor losses, Tensor dlogits, const Tensor& logits,
                              const Tensor& row_max, const Tensor& stats, const Tensor& targets,
                              int64_t vocab_start, float dloss) {
  const char* op = "vocab_parallel_ce_finish";
  const Call call = check_args(
      op, {{"logits", logits}, f32_on_cuda("row_max", row_max), f32_on_cuda("stats", stats)},
      {f32_on_cuda("losses", losses), {"dlogits", dlogits}}, {{"targets", targets}});
  const int64_t N = rows(logits), Vl = cols(logits);
  check_numel(op, {"stats", stats}, 2 * N);
  check_numel(op, {{"row_max", row_max}, {"targets", targets}, {"losses", losses}}, N);
  check_matrix(op, {"dlogits", dlogits}, N, Vl);
  run(
      call,
      [&] {
        cuda::vocab_parallel_ce_finish(losses, dlogits, logits, row_max, stats, targets, N, Vl,
                                       vocab_start, dloss);
      },
      [&]<typename T>(T) {
        cpu::vocab_parallel_ce_finish<T>(ptr<T>(losses), ptr<T>(dlogits), ptr<T>(logits),
                                         ptr<T>(row_max), ptr<T>(stats), ptr<int32_t>(targets), N,
                                         Vl, vocab_start, static_cast<T>(dloss));
      });
}

}  // namespace pentad::kernels
