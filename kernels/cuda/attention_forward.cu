// Causal attention, forward: out and the log-sum-exp per query row (the design and the
// tile helpers: attention_tiles.cuh).
#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace pentad::kernels::cuda {

namespace {

using namespace attention_tiles;

template <typename E, int kMaxD>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(E* out, float* lse, const E* q, const E* k, const E* v,
                             const int32_t* q_pos, const int32_t* k_pos, int64_t Tq, int64_t Tk,
                             int64_t Hq, int64_t Hkv, int D, float scale) {
  constexpr int kCells = kTile * kMaxD / kThreads;
  extern __shared__ float smem[];
  float* Qs = smem;                   // (32, D)
  float* Ks = Qs + kTile * D;         // (32, D + 1)
  float* Vs = Ks + kTile * (D + 1);   // (32, D)
  float* S = Vs + kTile * D;          // (32, 33): scores, then probabilities
  float* row_m = S + kTile * kS;      // running max per query row
  float* row_l = row_m + kTile;       // running sum of exp(score - max)
  float* row_alpha = row_l + kTile;   // rescale of the previous tiles' sums
  Cells<kMaxD> o(row_alpha + kTile);  // (32, kMaxD) where shared: the unnormalised output
  const int64_t qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = h / (Hq / Hkv);
  const int64_t r0 = qt * kTile;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;

  load_tile(Qs, D, q, b, r0, h, Hq, Tq, D);
  if (tid < kTile) {
    row_m[tid] = -INFINITY;
    row_l[tid] = 0.0f;
  }
#pragma unroll
  for (int c = 0; c < kCells; ++c) o[c] = 0.0f;

  const int64_t key_tiles = visible_key_tiles(q_pos, k_pos, r0, Tq, Tk);
  for (int64_t kt = 0; kt < key_tiles; ++kt) {
    const int64_t c0 = kt * kTile;
    __syncthreads();  // the previous tile is no longer read
    load_tile(Ks, D + 1, k, b, c0, hk, Hkv, Tk, D);
    load_tile(Vs, D, v, b, c0, hk, Hkv, Tk, D);
    __syncthreads();
#pragma unroll 1
    for (int c = 0; c < kScoreCells; ++c) {
      const int idx = tid + c * kThreads, i = idx / kTile, j = idx % kTile;
      const int64_t qi = r0 + i, kj = c0 + j;
      const bool seen = qi < Tq && kj < Tk && position(k_pos, kj) <= position(q_pos, qi);
      S[i * kS + j] = seen ? dot(Qs + i * D, Ks + j * (D + 1), D) * scale : -INFINITY;
    }
    __syncthreads();
    for (int r = 0; r < kRowsPerWarp; ++r) {  // lane j holds key j of row i
      const int i = warp * kRowsPerWarp + r;
      const float s = S[i * kS + lane];
      const float m_old = row_m[i];
      const float m_new = fmaxf(m_old, warp_max(s));
      const bool empty = m_new == -INFINITY;  // no key seen yet (or a row past Tq)
      const float p = empty ? 0.0f : expf(s - m_new);
      const float alpha = empty ? 1.0f : expf(m_old - m_new);
      S[i * kS + lane] = p;
      const float tile_sum = warp_sum(p);
      __syncwarp();
      if (lane == 0) {
        row_m[i] = m_new;
        row_l[i] = row_l[i] * alpha + tile_sum;
        row_alpha[i] = alpha;
      }
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kCells; ++c) {
      const int idx = tid + c * kThreads, i = idx / kMaxD, d = idx % kMaxD;
      if (d < D) {
        float acc = o[c] * row_alpha[i];
#pragma unroll 8
        for (int j = 0; j < kTile; ++j) acc += S[i * kS + j] * Vs[j * D + d];
        o[c] = acc;
      }
    }
  }
  __syncthreads();
  // A row that saw no key has row_l = 0: out 0, lse -inf.
#pragma unroll
  for (int c = 0; c < kCells; ++c) {
    const int idx = tid + c * kThreads, i = idx / kMaxD, d = idx % kMaxD;
    const int64_t qi = r0 + i;
    if (d < D && qi < Tq)
      out[((b * Tq + qi) * Hq + h) * D + d] = from_f32<E>(row_l[i] > 0.0f ? o[c] / row_l[i] : 0.0f);
  }
  if (lse && tid < kTile && r0 + tid < Tq)
    lse[(b * Hq + h) * Tq + r0 + tid] =
        row_l[tid] > 0.0f ? row_m[tid] + logf(row_l[tid]) : -INFINITY;
}

}  // namespace

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& q_pos, const Tensor& k_pos, int64_t B,
                       int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D) {
  if (B == 0 || Tq == 0 || Hq == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(Tq, kTile)), static_cast<unsigned>(Hq),
                  static_cast<unsigned>(B));
  const size_t bytes = smem_bytes(attention_forward_smem_floats(D));
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  require_shared_memory("attention_forward", bytes, D);
  by_dtype(q.dtype, [&](auto tag) {
    using E = typename decltype(tag)::type;
    by_max_d(D, [&](auto max_d) {
      constexpr int kMaxD = decltype(max_d)::value;
      auto kernel = attention_forward_kernel<E, kMaxD>;
      allow_shared_memory(reinterpret_cast<const void*>(kernel), bytes);
      kernel<<<grid, kThreads, bytes, stream()>>>(
          ptr<E>(out), ptr<float>(lse), ptr<E>(q), ptr<E>(k), ptr<E>(v), ptr<int32_t>(q_pos),
          ptr<int32_t>(k_pos), Tq, Tk, Hq, Hkv, static_cast<int>(D), scale);
    });
  });
  check_launch("attention_forward");
}

}  // namespace pentad::kernels::cuda
