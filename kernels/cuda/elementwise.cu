// Elementwise kernels and reductions over flat tensors: add, scale, convert, sum of squares,
// AdamW. Grid-stride loops; the launch shape depends only on n.
#include <cmath>

#include "core/device_memory.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

template <typename T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

template <typename T>
__global__ void scale_kernel(T* x, float s, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = from_f32<T>(to_f32(x[i]) * s);
}

template <typename To, typename From>
__global__ void convert_kernel(To* out, const From* inp, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = from_f32<To>(to_f32(inp[i]));
}

// Pass 1: each block writes the sum of its grid-stride share; pass 2 adds the block sums in
// block order. Both orders are fixed by n, so the result is bitwise reproducible.
template <typename T, bool kSquares = true>
__global__ void sum_squares_partial_kernel(double* partials, const T* x, int64_t n) {
  __shared__ double shared[kWarp];
  double acc = 0;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const double v = to_f32(x[i]);
    acc += kSquares ? v * v : v;
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// *total = the sum of the partials; with accumulate, *total += scale * that sum.
__global__ void sum_partials_kernel(double* total, const double* partials, int count,
                                    bool accumulate = false, double scale = 1.0) {
  __shared__ double shared[kWarp];
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) *total = accumulate ? *total + scale * acc : acc;
}

// Same arithmetic, in the same order, as kernels/cpu/elementwise.cpp (torch.optim.AdamW).
__global__ void adamw_kernel(const float* params, const float* m, const float* v, float* params_out,
                             float* m_out, float* v_out, const float* grads, int64_t n, float decay,
                             float w1, float b2, float w2, float step_size, float bias_c2_sqrt,
                             float eps) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float g = grads[i];
    float p = params[i] * decay;
    const float mi = w1 < 0.5f ? m[i] + w1 * (g - m[i]) : g - (g - m[i]) * (1.0f - w1);
    const float vi = v[i] * b2 + w2 * g * g;
    const float denom = sqrtf(vi) / bias_c2_sqrt + eps;
    p -= step_size * mi / denom;
    m_out[i] = mi;
    v_out[i] = vi;
    params_out[i] = p;
  }
}

}  // namespace

void add(const Tensor& out, const Tensor& a, const Tensor& b, int64_t n) {
  if (n == 0) return;
  by_dtype(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    add_kernel<T>
        <<<grid_for(n, kThreads), kThreads, 0, stream()>>>(ptr<T>(out), ptr<T>(a), ptr<T>(b), n);
  });
  check_launch("add");
}

void scale(const Tensor& x, float s, int64_t n) {
  if (n == 0) return;
  by_dtype(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scale_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(ptr<T>(x), s, n);
  });
  check_launch("scale");
}

void convert(const Tensor& out, const Tensor& inp, int64_t n) {
  if (n == 0) return;
  by_dtype(out.dtype, [&](auto to_tag) {
    by_dtype(inp.dtype, [&](auto from_tag) {
      using To = typename decltype(to_tag)::type;
      using From = typename decltype(from_tag)::type;
      convert_kernel<To, From>
          <<<grid_for(n, kThreads), kThreads, 0, stream()>>>(ptr<To>(out), ptr<From>(inp), n);
    });
  });
  check_launch("convert");
}

double sum_squares(const Tensor& x, int64_t n) {
  if (n == 0) return 0.0;
  const unsigned blocks = grid_for(n, kThreads);
  double* partials = static_cast<double*>(scratch((blocks + 1) * sizeof(double)));
  double* total = partials + blocks;
  by_dtype(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    sum_squares_partial_kernel<T><<<blocks, kThreads, 0, stream()>>>(partials, ptr<T>(x), n);
  });
  check_launch("sum_squares");
  sum_partials_kernel<<<1, 1024, 0, stream()>>>(total, partials, static_cast<int>(blocks));
  check_launch("sum_squares (partials)");
  double result = 0;
  count_device_wait();
  check(cudaMemcpy(&result, total, sizeof(double), cudaMemcpyDeviceToHost),
        "cudaMemcpy (sum_squares)");
  return result;
}

void sum_into(const Tensor& total, const Tensor& x, int64_t n, double scale, bool squares) {
  if (n == 0) return;
  const unsigned blocks = grid_for(n, kThreads);
  double* partials = static_cast<double*>(scratch(blocks * sizeof(double)));
  by_dtype(x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (squares)
      sum_squares_partial_kernel<T, true>
          <<<blocks, kThreads, 0, stream()>>>(partials, ptr<T>(x), n);
    else
      sum_squares_partial_kernel<T, false>
          <<<blocks, kThreads, 0, stream()>>>(partials, ptr<T>(x), n);
  });
  check_launch("sum_into");
  sum_partials_kernel<<<1, 1024, 0, stream()>>>(static_cast<double*>(total.data), partials,
                                                static_cast<int>(blocks), true, scale);
  check_launch("sum_into (partials)");
}

void adamw_update(const Tensor& params, const Tensor& m, const Tensor& v, const Tensor& params_out,
                  const Tensor& m_out, const Tensor& v_out, const Tensor& grads, int64_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step) {
  if (n == 0) return;
  // Scalars in double as Python computes them, rounded once to float (as the CPU kernel).
  const double lr_d = lr, beta1_d = beta1, beta2_d = beta2;
  const double bias_c1 = 1.0 - std::pow(beta1_d, static_cast<double>(step));
  const double bias_c2 = 1.0 - std::pow(beta2_d, static_cast<double>(step));
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
      ptr<float>(params), ptr<float>(m), ptr<float>(v), ptr<float>(params_out), ptr<float>(m_out),
      ptr<float>(v_out), ptr<float>(grads), n,
      static_cast<float>(1.0 - lr_d * static_cast<double>(weight_decay)),
      static_cast<float>(1.0 - beta1_d), static_cast<float>(beta2_d),
      static_cast<float>(1.0 - beta2_d), static_cast<float>(lr_d / bias_c1),
      static_cast<float>(std::sqrt(bias_c2)), eps);
  check_launch("adamw_update");
}

}  // namespace pentad::kernels::cuda
