// Softmax + cross-entropy fused with its gradient, whole-vocabulary and vocabulary-parallel.
// One block per row; every reduction is a fixed-order block reduction. dlogits may alias
// logits: each thread reads a logit before writing the same element, and the target logit
// is read before the first barrier.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels::cuda {

namespace {

constexpr int kThreads = 512;

template <typename T>
__device__ float row_max(const T* x, int64_t V, float* shared) {
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, to_f32(x[j]));
  return block_max(m, shared);
}

template <typename T>
__device__ float row_sum_exp(const T* x, int64_t V, float max, float* shared) {
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) s += expf(to_f32(x[j]) - max);
  return block_sum(s, shared);
}

// dlogits = softmax * dloss, minus dloss at the (local) target column when it is in range.
template <typename T>
__device__ void write_gradient(T* d, const T* x, int64_t V, float max, float sum, int64_t target,
                               float dloss) {
  const float factor = dloss / sum;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    float g = expf(to_f32(x[j]) - max) * factor;
    if (j == target) g -= dloss;
    d[j] = from_f32<T>(g);
  }
}

template <typename T>
__global__ void crossentropy_kernel(float* losses, T* dlogits, const T* logits,
                                    const int32_t* targets, int64_t V, float dloss) {
  __shared__ float shared[kWarp];
  const int64_t n = blockIdx.x;
  const T* x = logits + n * V;
  const int64_t target = targets[n];
  const bool valid = target >= 0 && target < V;
  const float x_target = valid ? to_f32(x[target]) : __int_as_float(0x7fc00000);
  const float max = row_max(x, V, shared);
  const float sum = row_sum_exp(x, V, max, shared);
  if (losses && threadIdx.x == 0) losses[n] = max + logf(sum) - x_target;
  if (dlogits) write_gradient(dlogits + n * V, x, V, max, sum, valid ? target : -1, dloss);
}

template <typename T>
__global__ void vocab_parallel_max_kernel(float* row_max_out, const T* logits, int64_t Vl) {
  __shared__ float shared[kWarp];
  const int64_t n = blockIdx.x;
  const float max = row_max(logits + n * Vl, Vl, shared);
  if (threadIdx.x == 0) row_max_out[n] = max;
}

// stats[n] = sum exp(logit - row_max); stats[N + n] = the target logit if local, else 0.
template <typename T>
__global__ void vocab_parallel_stats_kernel(float* stats, const T* logits, const float* row_maxes,
                                            const int32_t* targets, int64_t N, int64_t Vl,
                                            int64_t vocab_start) {
  __shared__ float shared[kWarp];
  const int64_t n = blockIdx.x;
  const T* x = logits + n * Vl;
  const float sum = row_sum_exp(x, Vl, row_maxes[n], shared);
  if (threadIdx.x == 0) {
    const int64_t local = targets[n] - vocab_start;
    stats[n] = sum;
    stats[N + n] = local >= 0 && local < Vl ? to_f32(x[local]) : 0.0f;
  }
}

template <typename T>
__global__ void vocab_parallel_finish_kernel(float* losses, T* dlogits, const T* logits,
                                             const float* row_maxes, const float* stats,
                                             const int32_t* targets, int64_t N, int64_t Vl,
                                             int64_t vocab_start, float dloss) {
  const int64_t n = blockIdx.x;
  const float max = row_maxes[n], sum = stats[n];
  if (losses && threadIdx.x == 0) losses[n] = max + logf(sum) - stats[N + n];
  if (!dlogits) return;
  const int64_t local = targets[n] - vocab_start;
  write_gradient(dlogits + n * Vl, logits + n * Vl, Vl, max, sum,
                 local >= 0 && local < Vl ? local : -1, dloss);
}

}  // namespace

void crossentropy_forward_backward(const Tensor& losses, const Tensor& dlogits,
                                   const Tensor& logits, const Tensor& targets, int64_t N,
                                   int64_t V, float dloss) {
  if (N == 0) return;
  by_dtype(logits.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    crossentropy_kernel<T><<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(
        ptr<float>(losses), ptr<T>(dlogits), ptr<T>(logits), ptr<int32_t>(targets), V, dloss);
  });
  check_launch("crossentropy_forward_backward");
}

void vocab_parallel_ce_max(const Tensor& row_max, const Tensor& logits, int64_t N, int64_t Vl) {
  if (N == 0) return;
  by_dtype(logits.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    vocab_parallel_max_kernel<T><<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(
        ptr<float>(row_max), ptr<T>(logits), Vl);
  });
  check_launch("vocab_parallel_ce_max");
}

void vocab_parallel_ce_stats(const Tensor& stats, const Tensor& logits, const Tensor& row_max,
                             const Tensor& targets, int64_t N, int64_t Vl, int64_t vocab_start) {
  if (N == 0) return;
  by_dtype(logits.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    vocab_parallel_stats_kernel<T><<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(
        ptr<float>(stats), ptr<T>(logits), ptr<float>(row_max), ptr<int32_t>(targets), N, Vl,
        vocab_start);
  });
  check_launch("vocab_parallel_ce_stats");
}

void vocab_parallel_ce_finish(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                              const Tensor& row_max, const Tensor& stats, const Tensor& targets,
                              int64_t N, int64_t Vl, int64_t vocab_start, float dloss) {
  if (N == 0) return;
  by_dtype(logits.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    vocab_parallel_finish_kernel<T><<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(
        ptr<float>(losses), ptr<T>(dlogits), ptr<T>(logits), ptr<float>(row_max), ptr<float>(stats),
        ptr<int32_t>(targets), N, Vl, vocab_start, dloss);
  });
  check_launch("vocab_parallel_ce_finish");
}

}  // namespace pentad::kernels::cuda
