// Causal attention, backward: dq, dk and dv from the forward's output and log-sum-exp,
// the probabilities recomputed tile by tile (the design and the tile helpers:
// attention_tiles.cuh).
#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels::cuda {

namespace {

using namespace attention_tiles;

// The first query tile that sees key c0: the first query at or after k_pos[c0] (lower bound
// in q_pos), c0 itself without positions.
__device__ int64_t first_seeing_query_tile(const int32_t* q_pos, const int32_t* k_pos, int64_t c0,
                                           int64_t Tq) {
  int64_t first = c0;
  if (q_pos) {
    const int32_t p = k_pos[c0];
    int64_t lo = 0, hi = Tq;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (q_pos[mid] < p)
        lo = mid + 1;
      else
        hi = mid;
    }
    first = lo;
  }
  return first / kTile;
}

// Di (B, Hq, T) = sum_d dout * out, one warp per (b, t, h) row.
template <typename E>
__global__ void attention_row_dot_kernel(float* Di, const E* dout, const E* out, int64_t rows,
                                         int64_t T, int64_t Hq, int D) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int lane = threadIdx.x % kWarp;
  float acc = 0.0f;
  for (int d = lane; d < D; d += kWarp) acc += to_f32(dout[r * D + d]) * to_f32(out[r * D + d]);
  acc = warp_sum(acc);
  const int64_t h = r % Hq, bt = r / Hq, t = bt % T, b = bt / T;
  if (lane == 0) Di[(b * Hq + h) * T + t] = acc;
}

// Row statistics of query rows [r0, r0 + 32) of head h, zero past T (= Tq).
__device__ void load_row_stats(float* lse_s, float* Di_s, const float* lse, const float* Di,
                               int64_t b, int64_t h, int64_t Hq, int64_t r0, int64_t T) {
  const int tid = threadIdx.x;
  if (tid < kTile) {
    const int64_t qi = r0 + tid;
    lse_s[tid] = qi < T ? lse[(b * Hq + h) * T + qi] : 0.0f;
    Di_s[tid] = qi < T ? Di[(b * Hq + h) * T + qi] : 0.0f;
  }
}

// P = exp(scale q.k - lse) and dS = P (dO.v - D_i) for the score cells of this thread;
// zero where the query does not see the key (or either index is past its T), and for a
// row no key was seen by (lse = -inf).
__device__ __forceinline__ bool sees(const int32_t* q_pos, const int32_t* k_pos, int64_t qi,
                                     int64_t kj, int64_t Tq, int64_t Tk) {
  return qi < Tq && kj < Tk && position(k_pos, kj) <= position(q_pos, qi);
}
__device__ __forceinline__ void score_gradient(float& p, float& ds, const float* Qs,
                                               const float* dOs, const float* Ks, const float* Vs,
                                               const float* lse_s, const float* Di_s, int i, int j,
                                               bool seen, int D, float scale) {
  p = 0.0f;
  ds = 0.0f;
  if (seen && lse_s[i] != -INFINITY) {
    p = expf(dot(Qs + i * D, Ks + j * (D + 1), D) * scale - lse_s[i]);
    ds = p * (dot(dOs + i * D, Vs + j * (D + 1), D) - Di_s[i]);
  }
}

template <typename E, int kMaxD>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(E* dq, const E* dout, const E* q, const E* k, const E* v, const float* lse,
                        const float* Di, const int32_t* q_pos, const int32_t* k_pos, int64_t Tq,
                        int64_t Tk, int64_t Hq, int64_t Hkv, int D, float scale, bool accumulate) {
  constexpr int kCells = kTile * kMaxD / kThreads;
  extern __shared__ float smem[];
  float* Qs = smem;                  // (32, D)
  float* dOs = Qs + kTile * D;       // (32, D)
  float* Ks = dOs + kTile * D;       // (32, D + 1)
  float* Vs = Ks + kTile * (D + 1);  // (32, D + 1)
  float* dS = Vs + kTile * (D + 1);  // (32, 33)
  float* lse_s = dS + kTile * kS;    // (32)
  float* Di_s = lse_s + kTile;       // (32)
  Cells<kMaxD> acc(Di_s + kTile);    // (32, kMaxD) where shared: dQ / scale
  const int64_t qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = h / (Hq / Hkv);
  const int64_t r0 = qt * kTile;
  const int tid = threadIdx.x;

  load_tile(Qs, D, q, b, r0, h, Hq, Tq, D);
  load_tile(dOs, D, dout, b, r0, h, Hq, Tq, D);
  load_row_stats(lse_s, Di_s, lse, Di, b, h, Hq, r0, Tq);
#pragma unroll
  for (int c = 0; c < kCells; ++c) acc[c] = 0.0f;

  const int64_t key_tiles = visible_key_tiles(q_pos, k_pos, r0, Tq, Tk);
  for (int64_t kt = 0; kt < key_tiles; ++kt) {
    const int64_t c0 = kt * kTile;
    __syncthreads();
    load_tile(Ks, D + 1, k, b, c0, hk, Hkv, Tk, D);
    load_tile(Vs, D + 1, v, b, c0, hk, Hkv, Tk, D);
    __syncthreads();
#pragma unroll 1
    for (int c = 0; c < kScoreCells; ++c) {
      const int idx = tid + c * kThreads, i = idx / kTile, j = idx % kTile;
      const bool seen = sees(q_pos, k_pos, r0 + i, c0 + j, Tq, Tk);
      float p, ds;
      score_gradient(p, ds, Qs, dOs, Ks, Vs, lse_s, Di_s, i, j, seen, D, scale);
      dS[i * kS + j] = ds;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kCells; ++c) {  // dQ += dS K
      const int idx = tid + c * kThreads, i = idx / kMaxD, d = idx % kMaxD;
      if (d < D) {
        float sum = acc[c];
#pragma unroll 8
        for (int j = 0; j < kTile; ++j) sum += dS[i * kS + j] * Ks[j * (D + 1) + d];
        acc[c] = sum;
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kCells; ++c) {
    const int idx = tid + c * kThreads, i = idx / kMaxD, d = idx % kMaxD;
    const int64_t qi = r0 + i;
    if (d < D && qi < Tq) {
      E& g = dq[((b * Tq + qi) * Hq + h) * D + d];
      g = from_f32<E>(accumulate ? to_f32(g) + scale * acc[c] : scale * acc[c]);
    }
  }
}

template <typename E, int kMaxD>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(E* dk, E* dv, const E* dout, const E* q, const E* k, const E* v,
                          const float* lse, const float* Di, const int32_t* q_pos,
                          const int32_t* k_pos, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv,
                          int D, float scale, bool accumulate) {
  constexpr int kCells = kTile * kMaxD / kThreads;
  extern __shared__ float smem[];
  float* Ks = smem;                  // (32, D + 1)
  float* Vs = Ks + kTile * (D + 1);  // (32, D + 1)
  float* Qs = Vs + kTile * (D + 1);  // (32, D)
  float* dOs = Qs + kTile * D;       // (32, D)
  float* P = dOs + kTile * D;        // (32, 33): [query row][key]
  float* dS = P + kTile * kS;        // (32, 33)
  float* lse_s = dS + kTile * kS;    // (32)
  float* Di_s = lse_s + kTile;       // (32)
  // (32, kMaxD) each where shared: dK / scale, dV
  Cells<kMaxD> dk_acc(Di_s + kTile), dv_acc(Di_s + kTile + kTile * kMaxD);
  const int64_t kt = blockIdx.x, hk = blockIdx.y, b = blockIdx.z, group = Hq / Hkv;
  const int64_t c0 = kt * kTile, q_tiles = (Tq + kTile - 1) / kTile;
  const int64_t first_q_tile = first_seeing_query_tile(q_pos, k_pos, c0, Tq);
  const int tid = threadIdx.x;

  load_tile(Ks, D + 1, k, b, c0, hk, Hkv, Tk, D);
  load_tile(Vs, D + 1, v, b, c0, hk, Hkv, Tk, D);
#pragma unroll
  for (int c = 0; c < kCells; ++c) dk_acc[c] = dv_acc[c] = 0.0f;

  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    // Earlier query rows cannot see these keys.
    for (int64_t qt = first_q_tile; qt < q_tiles; ++qt) {
      const int64_t r0 = qt * kTile;
      __syncthreads();
      load_tile(Qs, D, q, b, r0, h, Hq, Tq, D);
      load_tile(dOs, D, dout, b, r0, h, Hq, Tq, D);
      load_row_stats(lse_s, Di_s, lse, Di, b, h, Hq, r0, Tq);
      __syncthreads();
#pragma unroll 1
      for (int c = 0; c < kScoreCells; ++c) {
        const int idx = tid + c * kThreads, i = idx / kTile, j = idx % kTile;
        const bool seen = sees(q_pos, k_pos, r0 + i, c0 + j, Tq, Tk);
        float p, ds;
        score_gradient(p, ds, Qs, dOs, Ks, Vs, lse_s, Di_s, i, j, seen, D, scale);
        P[i * kS + j] = p;
        dS[i * kS + j] = ds;
      }
      __syncthreads();
#pragma unroll
      for (int c = 0; c < kCells; ++c) {  // dV += P^T dO, dK += dS^T Q; cell (key j, d)
        const int idx = tid + c * kThreads, j = idx / kMaxD, d = idx % kMaxD;
        if (d < D) {
          float sum_v = dv_acc[c], sum_k = dk_acc[c];
#pragma unroll 8
          for (int i = 0; i < kTile; ++i) {
            sum_v += P[i * kS + j] * dOs[i * D + d];
            sum_k += dS[i * kS + j] * Qs[i * D + d];
          }
          dv_acc[c] = sum_v;
          dk_acc[c] = sum_k;
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kCells; ++c) {
    const int idx = tid + c * kThreads, j = idx / kMaxD, d = idx % kMaxD;
    const int64_t kj = c0 + j;
    if (d < D && kj < Tk) {
      const int64_t at = ((b * Tk + kj) * Hkv + hk) * D + d;
      const float dk_new = scale * dk_acc[c], dv_new = dv_acc[c];
      dk[at] = from_f32<E>(accumulate ? to_f32(dk[at]) + dk_new : dk_new);
      dv[at] = from_f32<E>(accumulate ? to_f32(dv[at]) + dv_new : dv_new);
    }
  }
}

}  // namespace

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& q_pos, const Tensor& k_pos, int64_t B,
                        int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                        bool accumulate) {
  if (B == 0 || Hq == 0) return;
  if (Tq == 0 || Tk == 0) {  // no pairs: zero gradients unless adding to them
    if (!accumulate) {
      const size_t bytes = q.dtype == DType::BF16 ? 2 : 4;
      check(cudaMemsetAsync(dq.data, 0, dq.numel() * bytes, stream()), "cudaMemsetAsync");
      check(cudaMemsetAsync(dk.data, 0, dk.numel() * bytes, stream()), "cudaMemsetAsync");
      check(cudaMemsetAsync(dv.data, 0, dv.numel() * bytes, stream()), "cudaMemsetAsync");
    }
    return;
  }
  const int64_t rows = B * Tq * Hq;
  float* Di = static_cast<float*>(scratch(rows * sizeof(float)));
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  const size_t dq_bytes = smem_bytes(attention_dq_smem_floats(D));
  const size_t dkdv_bytes = smem_bytes(attention_dkdv_smem_floats(D));
  require_shared_memory("attention_backward", std::max(dq_bytes, dkdv_bytes), D);
  const unsigned q_tiles = static_cast<unsigned>(ceil_div(Tq, kTile));
  const unsigned k_tiles = static_cast<unsigned>(ceil_div(Tk, kTile));
  const int32_t* qp = ptr<int32_t>(q_pos);
  const int32_t* kp = ptr<int32_t>(k_pos);
  by_dtype(q.dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    attention_row_dot_kernel<E>
        <<<static_cast<unsigned>(ceil_div(rows, kWarps)), kThreads, 0, stream()>>>(
            Di, ptr<E>(dout), ptr<E>(out), rows, Tq, Hq, static_cast<int>(D));
    check_launch("attention_backward (row dots)");
    by_max_d(D, [&](auto max_d) {
      constexpr int kMaxD = decltype(max_d)::value;
      auto dq_kernel = attention_dq_kernel<E, kMaxD>;
      allow_shared_memory(reinterpret_cast<const void*>(dq_kernel), dq_bytes);
      dq_kernel<<<dim3(q_tiles, static_cast<unsigned>(Hq), static_cast<unsigned>(B)), kThreads,
                  dq_bytes, stream()>>>(ptr<E>(dq), ptr<E>(dout), ptr<E>(q), ptr<E>(k), ptr<E>(v),
                                        ptr<float>(lse), Di, qp, kp, Tq, Tk, Hq, Hkv,
                                        static_cast<int>(D), scale, accumulate);
      check_launch("attention_backward (dq)");
      auto dkdv_kernel = attention_dkdv_kernel<E, kMaxD>;
      allow_shared_memory(reinterpret_cast<const void*>(dkdv_kernel), dkdv_bytes);
      dkdv_kernel<<<dim3(k_tiles, static_cast<unsigned>(Hkv), static_cast<unsigned>(B)), kThreads,
                    dkdv_bytes, stream()>>>(ptr<E>(dk), ptr<E>(dv), ptr<E>(dout), ptr<E>(q),
                                            ptr<E>(k), ptr<E>(v), ptr<float>(lse), Di, qp, kp, Tq,
                                            Tk, Hq, Hkv, static_cast<int>(D), scale, accumulate);
      check_launch("attention_backward (dk, dv)");
    });
  });
}

}  // namespace pentad::kernels::cuda
