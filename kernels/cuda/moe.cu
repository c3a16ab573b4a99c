// MoE token permutation (kernels/ops.h; the CPU reference is kernels/cpu/moe.cpp). The
// per-token gather formulation of the CPU kernels, never a scatter-add over experts: every
// output element has one writer, and a token's sum over its picks runs in pick order, so
// results are bitwise reproducible without atomics. Grid-stride loops; launch shapes depend
// only on the sizes.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float nan_f32() {
  return __int_as_float(0x7fc00000);
}

__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// out (A, C): out[a] = inp[src[a]], a copy of the row's bits.
template <typename T>
__global__ void permute_kernel(T* out, const T* inp, const int32_t* src, int64_t A, int64_t C,
                               int64_t rows) {
  const int64_t n = A * C;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t a = i / C, c = i % C;
    const int64_t row = src[a];
    out[i] = row >= 0 && row < rows ? inp[row * C + c] : from_f32<T>(nan_f32());
  }
}

// out (N, C): out[t] (+)= sum over j of w[t, j] * inp[pos[t, j]], picks in order, in F32.
template <typename T>
__global__ void unpermute_kernel(T* out, const T* inp, const int32_t* pos, const float* w,
                                 int64_t N, int64_t K, int64_t C, int64_t rows, bool accumulate) {
  const int64_t n = N * C;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t t = i / C, c = i % C;
    float acc = accumulate ? to_f32(out[i]) : 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t p = pos[t * K + j];
      if (p < 0) continue;  // dropped by capacity
      const float x = p < rows ? to_f32(inp[p * C + c]) : nan_f32();
      acc += w ? w[t * K + j] * x : x;
    }
    out[i] = from_f32<T>(acc);
  }
}

// One warp per pick i = (t, j): dinp[pos[i]] = w[i] * dout[t] and dw[i] = <dout[t],
// inp[pos[i]]>, each lane's partial sum over its columns added in the warp's fixed butterfly
// order. pos maps kept picks one to one onto rows of dinp, so every row has one writer; rows
// no pick names are left as they are (as on the CPU).
template <typename T>
__global__ void unpermute_backward_kernel(T* dinp, float* dw, const T* dout, const T* inp,
                                          const int32_t* pos, const float* w, int64_t picks,
                                          int64_t K, int64_t C, int64_t rows) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t warps = grid_stride() / kWarp;
  for (int64_t i = first_index() / kWarp; i < picks; i += warps) {  // uniform in the warp
    const int64_t p = pos[i];
    if (p < 0 || p >= rows) {
      if (lane == 0) dw[i] = p < 0 ? 0.0f : nan_f32();
      continue;
    }
    const T* g = dout + (i / K) * C;
    const T* x = inp + p * C;
    T* d = dinp + p * C;
    const float s = w[i];
    float dot = 0.0f;
    for (int64_t c = lane; c < C; c += kWarp) {
      const float gc = to_f32(g[c]);
      d[c] = from_f32<T>(s * gc);
      dot += gc * to_f32(x[c]);
    }
    dot = warp_sum(dot);
    if (lane == 0) dw[i] = dot;
  }
}

}  // namespace

void moe_permute(const Tensor& out, const Tensor& inp, const Tensor& src, int64_t A, int64_t C,
                 int64_t inp_rows) {
  const int64_t n = A * C;
  if (n == 0) return;
  by_dtype(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    permute_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
        ptr<T>(out), ptr<T>(inp), ptr<int32_t>(src), A, C, inp_rows);
  });
  check_launch("moe_permute");
}

void moe_unpermute(const Tensor& out, const Tensor& inp, const Tensor& pos, const Tensor& w,
                   int64_t N, int64_t k, int64_t C, int64_t inp_rows, bool accumulate) {
  const int64_t n = N * C;
  if (n == 0) return;
  by_dtype(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    unpermute_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
        ptr<T>(out), ptr<T>(inp), ptr<int32_t>(pos), ptr<float>(w), N, k, C, inp_rows, accumulate);
  });
  check_launch("moe_unpermute");
}

void moe_unpermute_backward(const Tensor& dinp, const Tensor& dw, const Tensor& dout,
                            const Tensor& inp, const Tensor& pos, const Tensor& w, int64_t N,
                            int64_t k, int64_t C, int64_t inp_rows) {
  const int64_t picks = N * k;
  if (picks == 0) return;
  by_dtype(dout.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    unpermute_backward_kernel<T><<<grid_for(picks * kWarp, kThreads), kThreads, 0, stream()>>>(
        ptr<T>(dinp), ptr<float>(dw), ptr<T>(dout), ptr<T>(inp), ptr<int32_t>(pos), ptr<float>(w),
        picks, k, C, inp_rows);
  });
  check_launch("moe_unpermute_backward");
}

}  // namespace pentad::kernels::cuda
