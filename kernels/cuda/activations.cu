// GELU (tanh approximation, GPT-2) and SwiGLU (LLaMA), forward and backward, elementwise.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* inp, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float x = to_f32(inp[i]);
    out[i] = from_f32<T>(0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCubic * x * x * x))));
  }
}

template <typename T>
__global__ void gelu_backward_kernel(T* dinp, const T* dout, const T* inp, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float x = to_f32(inp[i]);
    const float th = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
    const float sech2 = 1.0f - th * th;
    const float grad =
        0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] = from_f32<T>(grad * to_f32(dout[i]));
  }
}

template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* gate, const T* up, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float g = to_f32(gate[i]);
    out[i] = from_f32<T>(g / (1.0f + expf(-g)) * to_f32(up[i]));
  }
}

// dgate or dup may be null (absent).
template <typename T>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up,
                                       int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float g = to_f32(gate[i]), u = to_f32(up[i]), dy = to_f32(dout[i]);
    const float sig = 1.0f / (1.0f + expf(-g));
    // d silu(g) / dg = sig * (1 + g * (1 - sig)); every input is read before either write,
    // so dgate or dup may alias dout.
    const float dg = dy * u * sig * (1.0f + g * (1.0f - sig));
    const float du = dy * g * sig;
    if (dgate) dgate[i] = from_f32<T>(dg);
    if (dup) dup[i] = from_f32<T>(du);
  }
}

}  // namespace

void gelu_forward(const Tensor& out, const Tensor& inp, int64_t n) {
  if (n == 0) return;
  by_dtype(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gelu_forward_kernel<T>
        <<<grid_for(n, kThreads), kThreads, 0, stream()>>>(ptr<T>(out), ptr<T>(inp), n);
  });
  check_launch("gelu_forward");
}

void gelu_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp, int64_t n) {
  if (n == 0) return;
  by_dtype(dinp.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gelu_backward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
        ptr<T>(dinp), ptr<T>(dout), ptr<T>(inp), n);
  });
  check_launch("gelu_backward");
}

void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up, int64_t n) {
  if (n == 0) return;
  by_dtype(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    swiglu_forward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
        ptr<T>(out), ptr<T>(gate), ptr<T>(up), n);
  });
  check_launch("swiglu_forward");
}

void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up, int64_t n) {
  if (n == 0) return;
  by_dtype(dout.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    swiglu_backward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
        ptr<T>(dgate), ptr<T>(dup), ptr<T>(dout), ptr<T>(gate), ptr<T>(up), n);
  });
  check_launch("swiglu_backward");
}

}  // namespace pentad::kernels::cuda
