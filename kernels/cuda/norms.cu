// LayerNorm and RMSNorm: forward (optionally fused with the residual add before it) and
// backward. One warp per row for everything that reduces along a row.
//
// Backward (norm_backward_rows_kernel) reads each row's dout and inp once, in 16-byte
// vectors, keeps them in registers for its second pass (dinp += ...), and sums the parameter
// gradients (dweight, dbias) of each thread's columns in registers over every row it sees;
// a block adds its threads' sums in a fixed order into one partial row and
// add_block_partials_kernel adds those rows in block order, so nothing uses atomics and the
// result is bitwise the same on every run. Traffic: dout, inp, dinp read and dinp written
// (8 bytes a BF16 element), plus 2 x blocks x C partials in F32 (tiling.h:
// norm_backward_shape; about 6% at GPT-2's 8 x 1024 rows of 768). Rows too wide for the
// registers (norm_backward_shape says which) take the two-kernel path of before: a warp per
// row for dinp, column partials over chunks of rows (tiling.h: column_chunk_rows).
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

// Makes the compiler convert a pack's elements again where they are next used, instead of
// keeping the F32 values of its first use alive meanwhile: norm_backward_rows_kernel reads a
// BF16 row twice, and holding both passes' 72 floats in registers made it spill (a pack is
// 12 registers, its floats 24). An empty asm that "changes" each 32-bit word: no instruction.
template <typename T, int kWidth>
__device__ __forceinline__ void keep_packed(Pack<T, kWidth>& p) {
  if constexpr (sizeof(p) % 4 == 0) {  // single BF16 elements: nothing to gain
    auto* words = reinterpret_cast<uint32_t*>(&p);
#pragma unroll
    for (size_t i = 0; i < sizeof(p) / 4; ++i) asm volatile("" : "+r"(words[i]));
  }
}

// The fast backward (tiling.h: NormBackwardShape): groups of `group_threads` threads (a warp,
// or several for wide rows) each take one row per round, rows in order; thread t of a group
// owns accesses t, t + G, t + 2G of kWidth columns in every row (the same columns in every
// round, so its weight vectors are loaded once). Per row: load dout, inp and dinp for all its
// accesses at once, reduce the two row sums over the group (shuffles, plus shared memory and
// one barrier per round when the group spans warps; double-buffered by round parity, so one
// barrier suffices), then write dinp and add into its column sums. Those sums
// live in shared memory, one slot per thread and column it owns (column_sums[thread][slot],
// rows padded to an odd length so that a warp's accesses fall in distinct banks): in
// registers (48 floats with BF16) they spilled.
//
// Registers (nvcc -Xptxas -v, sm_90, CUDA 13.0): capped at 96 with no spills (BF16 x8: 96;
// F32 x4: 94-96; one element at a time: 68-80); uncapped, ptxas took 121-127 and spilled
// 36-40 bytes. 96 x 512 threads fits the register file, so the widest group launches. At
// GPT-2's shape (BF16, C 768: 256 threads, 8 warps of one row each, 49 KiB of column sums)
// two blocks fit an SM, so the grid (256 blocks) is one wave on 132 SMs, and a warp has
// 3 x 3 x 512 bytes of loads in flight per row (dout, inp, dinp): with 16 warps an SM,
// about 72 KiB, enough to cover HBM's latency.
constexpr int kNormBackwardRegisters = 96;
template <typename T, bool kRms, int kWidth>
__global__ void __maxnreg__(kNormBackwardRegisters)
    norm_backward_rows_kernel(T* dinp, float* partials, const T* dout, const T* inp,
                              const T* weight, const float* mean, const float* rstd, int64_t N,
                              int C, int group_threads, int64_t rounds) {
  using P = Pack<T, kWidth>;
  constexpr int K = kNormBackwardVecs;
  constexpr int kSums = kRms ? 1 : 2;              // dweight (and dbias) per column
  constexpr int kStride = K * kWidth * kSums + 1;  // odd: a warp's slots in distinct banks
  extern __shared__ float column_sums[];           // (blockDim.x, kStride)
  __shared__ float row_sums[2][kNormBackwardMaxThreads / kWarp][2];
  const int threads = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  const int groups = threads / group_threads, group = tid / group_threads;
  const int t = tid % group_threads;
  const int warps = group_threads / kWarp, warp = tid / kWarp;
  const int vecs = C / kWidth, cols = kSums * C;
  const float inv_C = 1.0f / static_cast<float>(C);
  auto slot = [&](int k, int e, int which) -> float& {
    return column_sums[tid * kStride + (k * kWidth + e) * kSums + which];
  };

  P w[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int v = t + k * group_threads;
    if (v >= vecs) continue;
    w[k] = load_pack<T, kWidth>(weight + v * kWidth);
#pragma unroll
    for (int e = 0; e < kWidth; ++e)
      for (int which = 0; which < kSums; ++which) slot(k, e, which) = 0.0f;
  }

  for (int64_t r = 0; r < rounds; ++r) {
    const int64_t row = (static_cast<int64_t>(blockIdx.x) * rounds + r) * groups + group;
    const bool active = row < N;
    const int64_t base = row * C;
    P dy[K], x[K], dx[K];
    float m = 0.0f, s = 0.0f, g_sum = 0.0f, g_xhat_sum = 0.0f;
    if (active) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int v = t + k * group_threads;
        if (v >= vecs) continue;
        dy[k] = load_pack<T, kWidth>(dout + base + v * kWidth);
        x[k] = load_pack<T, kWidth>(inp + base + v * kWidth);
        if (dinp) dx[k] = load_pack<T, kWidth>(dinp + base + v * kWidth);
      }
      if (!kRms) m = mean[row];
      s = rstd[row];
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (t + k * group_threads >= vecs) continue;
#pragma unroll
        for (int e = 0; e < kWidth; ++e) {
          const float g = to_f32(dy[k].v[e]) * to_f32(w[k].v[e]);
          g_sum += g;
          g_xhat_sum += g * (to_f32(x[k].v[e]) - m) * s;
        }
      }
    }
    g_sum = warp_sum(g_sum);
    g_xhat_sum = warp_sum(g_xhat_sum);
    if (warps > 1) {  // the same for every thread of the block: the barrier is reached by all
      float(*sums)[2] = row_sums[r & 1];
      if (tid % kWarp == 0) {
        sums[warp][0] = g_sum;
        sums[warp][1] = g_xhat_sum;
      }
      __syncthreads();
      g_sum = g_xhat_sum = 0.0f;
      for (int i = group * warps; i < (group + 1) * warps; ++i) {
        g_sum += sums[i][0];
        g_xhat_sum += sums[i][1];
      }
    }
    if (!active) continue;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      keep_packed(dy[k]);
      keep_packed(x[k]);
      keep_packed(w[k]);
    }
    const float g_mean = kRms ? 0.0f : g_sum * inv_C, g_xhat_mean = g_xhat_sum * inv_C;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int v = t + k * group_threads;
      if (v >= vecs) continue;
      P out;
#pragma unroll
      for (int e = 0; e < kWidth; ++e) {
        const float d = to_f32(dy[k].v[e]);
        const float xhat = (to_f32(x[k].v[e]) - m) * s;
        slot(k, e, 0) += d * xhat;
        if (!kRms) slot(k, e, 1) += d;
        const float delta = s * (d * to_f32(w[k].v[e]) - g_mean - xhat * g_xhat_mean);
        if (dinp) out.v[e] = from_f32<T>(to_f32(dx[k].v[e]) + delta);
      }
      if (dinp) store_pack<T, kWidth>(dinp + base + v * kWidth, out);
    }
  }
  if (!partials) return;  // the same for every thread of the block

  // Column c (dbias: C + c) of this block's partial row: the groups' sums in group order.
  __syncthreads();
  float* out = partials + static_cast<int64_t>(blockIdx.x) * cols;
  for (int c = tid; c < cols; c += threads) {
    const int which = c / C, column = c % C;
    const int v = column / kWidth, e = column % kWidth;
    const int owner = v % group_threads, k = v / group_threads;
    const float* sums = column_sums + owner * kStride + (k * kWidth + e) * kSums + which;
    float total = 0.0f;
    for (int g = 0; g < groups; ++g) total += sums[g * group_threads * kStride];
    out[c] = total;
  }
}

// dweight[c] += sum of partials[b][c] over blocks b, dbias[c] += that of partials[b][C + c]
// (cols = C or 2C; either output may be null). A block adds 32 columns: warp i the partial
// rows i, i + 16, ..., then warp 0 the 16 warps' sums in order.
constexpr int kPartialsThreads = 512;
__global__ void __launch_bounds__(kPartialsThreads)
    add_block_partials_kernel(float* dweight, float* dbias, const float* partials, int64_t blocks,
                              int C, int cols) {
  __shared__ float warp_sums[kPartialsThreads / kWarp][kWarp];
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int c = static_cast<int>(blockIdx.x) * kWarp + lane;
  float acc = 0.0f;
  if (c < cols) {
#pragma unroll 4
    for (int64_t b = warp; b < blocks; b += kPartialsThreads / kWarp) acc += partials[b * cols + c];
  }
  warp_sums[warp][lane] = acc;
  __syncthreads();
  if (warp != 0 || c >= cols) return;
  float total = 0.0f;
  for (int i = 0; i < kPartialsThreads / kWarp; ++i) total += warp_sums[i][lane];
  if (c < C) {
    if (dweight) dweight[c] += total;
  } else if (dbias) {
    dbias[c - C] += total;
  }
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

template <typename T, bool kRms, int kWidth>
void norm_backward_rows(const NormBackwardShape& shape, const Tensor& dinp, const Tensor& dweight,
                        const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& mean, const Tensor& rstd, int64_t N,
                        int64_t C, const char* name) {
  const bool grads = dweight.data || dbias.data;
  const int64_t cols = kRms ? C : 2 * C;
  float* partials =
      grads ? static_cast<float*>(scratch(static_cast<size_t>(shape.blocks * cols) * sizeof(float)))
            : nullptr;
  const size_t shared_bytes =
      static_cast<size_t>((kNormBackwardVecs * kWidth * (kRms ? 1 : 2) + 1) * shape.threads) *
      sizeof(float);
  const auto kernel = norm_backward_rows_kernel<T, kRms, kWidth>;
  // The static row_sums (2 KiB at most) count towards the 48 KiB default as well.
  allow_shared_memory(reinterpret_cast<const void*>(kernel), shared_bytes + 2048);
  kernel<<<static_cast<unsigned>(shape.blocks), static_cast<unsigned>(shape.threads), shared_bytes,
           stream()>>>(ptr<T>(dinp), partials, ptr<T>(dout), ptr<T>(inp), ptr<T>(weight),
                       ptr<float>(mean), ptr<float>(rstd), N, static_cast<int>(C),
                       shape.group_threads, shape.rounds);
  check_launch(name);
  if (!grads) return;
  add_block_partials_kernel<<<static_cast<unsigned>(ceil_div(cols, kWarp)), kPartialsThreads, 0,
                              stream()>>>(ptr<float>(dweight), ptr<float>(dbias), partials,
                                          shape.blocks, static_cast<int>(C),
                                          static_cast<int>(cols));
  check_launch(name);
}

template <bool kRms>
void norm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                   const Tensor& dout, const Tensor& inp, const Tensor& weight, const Tensor& mean,
                   const Tensor& rstd, int64_t N, int64_t C, const char* name) {
  if (N == 0 || C == 0) return;
  by_dtype(dout.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // 16-byte accesses need every row to start on 16 bytes: C a multiple of 8 (BF16) or 4
    // (F32) and 16-byte aligned tensors; other shapes take the same kernel one element at a
    // time. Rows too wide for either take the kernels below.
    const bool aligned = C % kVec<T> == 0 && pointer_alignment(dout.data) >= 16 &&
                         pointer_alignment(inp.data) >= 16 &&
                         pointer_alignment(weight.data) >= 16 &&
                         (!dinp.data || pointer_alignment(dinp.data) >= 16);
    const int width = aligned ? kVec<T> : 1;
    const NormBackwardShape shape = norm_backward_shape(N, C, width);
    if (shape.blocks > 0) {
      if (aligned)
        norm_backward_rows<T, kRms, kVec<T>>(shape, dinp, dweight, dbias, dout, inp, weight, mean,
                                             rstd, N, C, name);
      else
        norm_backward_rows<T, kRms, 1>(shape, dinp, dweight, dbias, dout, inp, weight, mean, rstd,
                                       N, C, name);
      return;
    }
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
