// LayerNorm and RMSNorm: forward (optionally fused with the residual add before it) and
// backward. One warp per row for everything that reduces along a row; parameter gradients
// are column sums done in two deterministic passes (tiling.h: column_chunk_rows).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr int kThreads = kRowsPerBlock * kWarp;
constexpr int kColumnThreads = 256;

__device__ __forceinline__ int64_t warp_row() {
  return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
}

// out = (x - mean) * rstd * weight + bias, with mean = 0 for RMSNorm. With kResidual the row
// is x = residual = a + b, rounded to T and written first; the norm reads it back (each lane
// reads only the columns it wrote), so the result equals add() followed by the plain norm.
template <typename T, bool kRms, bool kResidual>
__global__ void norm_forward_kernel(T* out, float* mean, float* rstd, T* residual, const T* inp,
                                    const T* a, const T* b, const T* weight, const T* bias,
                                    int64_t N, int C, float eps) {
  const int64_t row = warp_row();
  if (row >= N) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t base = row * C;
  if constexpr (kResidual) {
    for (int c = lane; c < C; c += kWarp)
      residual[base + c] = from_f32<T>(to_f32(a[base + c]) + to_f32(b[base + c]));
  }
  const T* x = (kResidual ? residual : inp) + base;
  float m = 0.0f;
  if constexpr (!kRms) {
    float sum = 0.0f;
    for (int c = lane; c < C; c += kWarp) sum += to_f32(x[c]);
    m = warp_sum(sum) / static_cast<float>(C);
  }
  float var = 0.0f;  // two passes: no cancellation when |mean| >> std
  for (int c = lane; c < C; c += kWarp) {
    const float d = to_f32(x[c]) - m;
    var += d * d;
  }
  var = warp_sum(var);
  const float s = 1.0f / sqrtf(var / static_cast<float>(C) + eps);
  T* y = out + base;
  for (int c = lane; c < C; c += kWarp) {
    float v = (to_f32(x[c]) - m) * s * to_f32(weight[c]);
    if (bias) v += to_f32(bias[c]);
    y[c] = from_f32<T>(v);
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = s;
  }
}

// dinp += s * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight, xhat = (x - m) * s;
// RMSNorm drops the mean(g) term (m = 0).
template <typename T, bool kRms>
__global__ void norm_backward_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                          const float* mean, const float* rstd, int64_t N, int C) {
  const int64_t row = warp_row();
  if (row >= N) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t base = row * C;
  const float m = kRms ? 0.0f : mean[row], s = rstd[row];
  float g_sum = 0.0f, g_xhat_sum = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float g = to_f32(dout[base + c]) * to_f32(weight[c]);
    g_sum += g;
    g_xhat_sum += g * (to_f32(inp[base + c]) - m) * s;
  }
  const float g_mean = kRms ? 0.0f : warp_sum(g_sum) / static_cast<float>(C);
  const float g_xhat_mean = warp_sum(g_xhat_sum) / static_cast<float>(C);
  for (int c = lane; c < C; c += kWarp) {
    const float g = to_f32(dout[base + c]) * to_f32(weight[c]);
    const float xhat = (to_f32(inp[base + c]) - m) * s;
    const float delta = s * (g - g_mean - xhat * g_xhat_mean);
    dinp[base + c] = from_f32<T>(to_f32(dinp[base + c]) + delta);
  }
}

// Partial column sums of dout * xhat (dweight) and dout (dbias) over one chunk of rows:
// grid (column blocks, chunks). Either output may be null.
template <typename T, bool kRms>
__global__ void norm_backward_params_kernel(float* partial_w, float* partial_b, const T* dout,
                                            const T* inp, const float* mean, const float* rstd,
                                            int64_t N, int C, int64_t chunk_rows) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * chunk_rows, r1 = min(N, r0 + chunk_rows);
  float acc_w = 0.0f, acc_b = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float dy = to_f32(dout[r * C + c]);
    const float m = kRms ? 0.0f : mean[r];
    acc_w += dy * (to_f32(inp[r * C + c]) - m) * rstd[r];
    acc_b += dy;
  }
  if (partial_w) partial_w[chunk * C + c] = acc_w;
  if (partial_b) partial_b[chunk * C + c] = acc_b;
}

__global__ void add_column_partials_kernel(float* out, const float* partials, int64_t chunks,
                                           int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) acc += partials[k * C + c];
  out[c] += acc;
}

unsigned row_blocks(int64_t N) {
  return static_cast<unsigned>(ceil_div(N, kRowsPerBlock));
}

template <bool kRms, bool kResidual>
void norm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                  const Tensor& inp, const Tensor& a, const Tensor& b, const Tensor& weight,
                  const Tensor& bias, int64_t N, int64_t C, float eps, const char* name) {
  if (N == 0) return;
  by_dtype(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    norm_forward_kernel<T, kRms, kResidual><<<row_blocks(N), kThreads, 0, stream()>>>(
        ptr<T>(out), ptr<float>(mean), ptr<float>(rstd), ptr<T>(residual), ptr<T>(inp), ptr<T>(a),
        ptr<T>(b), ptr<T>(weight), ptr<T>(bias), N, static_cast<int>(C), eps);
  });
  check_launch(name);
}

template <bool kRms>
void norm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                   const Tensor& dout, const Tensor& inp, const Tensor& weight, const Tensor& mean,
                   const Tensor& rstd, int64_t N, int64_t C, const char* name) {
  if (N == 0 || C == 0) return;
  by_dtype(dout.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (dinp.data) {
      norm_backward_dinp_kernel<T, kRms><<<row_blocks(N), kThreads, 0, stream()>>>(
          ptr<T>(dinp), ptr<T>(dout), ptr<T>(inp), ptr<T>(weight), ptr<float>(mean),
          ptr<float>(rstd), N, static_cast<int>(C));
      check_launch(name);
    }
    if (!dweight.data && !dbias.data) return;
    const int64_t chunk_rows = column_chunk_rows(N), chunks = column_chunks(N);
    float* partials = static_cast<float*>(scratch(2 * chunks * C * sizeof(float)));
    float* partial_w = dweight.data ? partials : nullptr;
    float* partial_b = dbias.data ? partials + chunks * C : nullptr;
    const dim3 grid(static_cast<unsigned>(ceil_div(C, kColumnThreads)),
                    static_cast<unsigned>(chunks));
    norm_backward_params_kernel<T, kRms><<<grid, kColumnThreads, 0, stream()>>>(
        partial_w, partial_b, ptr<T>(dout), ptr<T>(inp), ptr<float>(mean), ptr<float>(rstd), N,
        static_cast<int>(C), chunk_rows);
    check_launch(name);
    if (partial_w) add_column_partials(ptr<float>(dweight), partial_w, chunks, C);
    if (partial_b) add_column_partials(ptr<float>(dbias), partial_b, chunks, C);
  });
}

}  // namespace

void add_column_partials(float* out, const float* partials, int64_t chunks, int64_t C) {
  if (C == 0) return;
  add_column_partials_kernel<<<static_cast<unsigned>(ceil_div(C, kColumnThreads)), kColumnThreads,
                               0, stream()>>>(out, partials, chunks, C);
  check_launch("add_column_partials");
}

void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias, int64_t N, int64_t C, float eps) {
  norm_forward<false, false>(out, mean, rstd, Tensor{}, inp, Tensor{}, Tensor{}, weight, bias, N, C,
                             eps, "layernorm_forward");
}

void residual_layernorm_forward(const Tensor& residual, const Tensor& out, const Tensor& mean,
                                const Tensor& rstd, const Tensor& a, const Tensor& b,
                                const Tensor& weight, const Tensor& bias, int64_t N, int64_t C,
                                float eps) {
  norm_forward<false, true>(out, mean, rstd, residual, Tensor{}, a, b, weight, bias, N, C, eps,
                            "residual_layernorm_forward");
}

void layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                        const Tensor& dout, const Tensor& inp, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, int64_t N, int64_t C) {
  norm_backward<false>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                       "layernorm_backward");
}

void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                     int64_t N, int64_t C, float eps) {
  norm_forward<true, false>(out, Tensor{}, rstd, Tensor{}, inp, Tensor{}, Tensor{}, weight,
                            Tensor{}, N, C, eps, "rmsnorm_forward");
}

void residual_rmsnorm_forward(const Tensor& residual, const Tensor& out, const Tensor& rstd,
                              const Tensor& a, const Tensor& b, const Tensor& weight, int64_t N,
                              int64_t C, float eps) {
  norm_forward<true, true>(out, Tensor{}, rstd, residual, Tensor{}, a, b, weight, Tensor{}, N, C,
                           eps, "residual_rmsnorm_forward");
}

void rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout,
                      const Tensor& inp, const Tensor& weight, const Tensor& rstd, int64_t N,
                      int64_t C) {
  norm_backward<true>(dinp, dweight, Tensor{}, dout, inp, weight, Tensor{}, rstd, N, C,
                      "rmsnorm_backward");
}

}  // namespace pentad::kernels::cuda
