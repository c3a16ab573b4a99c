#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"

// Layout: q, out, dq, dout are (B, T, Hq, D) so the rows of one head are D values apart by
// Hq * D (ldq); k, v likewise with ldk = Hkv * D. Every gemm below reads the heads in place
// through these leading dimensions; nothing is transposed or copied.
//
// Per (b, h) and block of query rows [r0, r1), the keys that can be seen are [0, r1):
//   S (rows, r1) = scale * Q_blk K^T     P = softmax(S) with j > i masked to 0
//   O_blk = P V                          lse_i = log sum_j exp(S_ij)
// Backward recomputes P = exp(S - lse) and, with D_i = dO_i . O_i,
//   dP = dO_blk V^T    dS = P * (dP - D)    dQ_blk = scale dS K
//   dK[0, r1) += scale dS^T Q_blk          dV[0, r1) += P^T dO_blk
namespace pentad::kernels::cpu {

namespace {

// Softmax of one score row in place over keys [0, valid), zeroing [valid, width); returns
// the row's log-sum-exp.
template <typename T>
T softmax_row(T* row, int64_t valid, int64_t width) {
  T max = row[0];
#pragma omp simd reduction(max : max)
  for (int64_t j = 1; j < valid; ++j) max = row[j] > max ? row[j] : max;
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < valid; ++j) {
    const T e = exp_vec(row[j] - max);
    row[j] = e;
    sum += e;
  }
  const T inv = T(1) / sum;
#pragma omp simd
  for (int64_t j = 0; j < valid; ++j) row[j] *= inv;
  std::fill(row + valid, row + width, T(0));
  return max + std::log(sum);
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, int64_t B, int64_t T_,
                       int64_t Hq, int64_t Hkv, int64_t D) {
  const int64_t group = Hq / Hkv;
  const int64_t blocks = (T_ + kAttentionBlock - 1) / kAttentionBlock;
  const int64_t ldq = Hq * D, ldk = Hkv * D;
  const T scale = T(1) / std::sqrt(T(D));
#pragma omp parallel
  {
    std::vector<T> scores(static_cast<size_t>(kAttentionBlock * T_));
    // Tasks are independent (each writes its own rows of out and lse); the cyclic
    // schedule interleaves short early blocks with long late ones across threads.
#pragma omp for schedule(static, 1)
    for (int64_t task = 0; task < B * Hq * blocks; ++task) {
      const int64_t blk = task % blocks, h = task / blocks % Hq, b = task / (blocks * Hq);
      const int64_t r0 = blk * kAttentionBlock, r1 = std::min(T_, r0 + kAttentionBlock);
      const int64_t rows = r1 - r0, hk = h / group;
      const T* q_blk = q + (b * T_ + r0) * ldq + h * D;
      const T* k_head = k + b * T_ * ldk + hk * D;
      const T* v_head = v + b * T_ * ldk + hk * D;
      T* s = scores.data();
      gemm(false, true, rows, r1, D, scale, q_blk, ldq, k_head, ldk, T(0), s, r1);
      for (int64_t i = 0; i < rows; ++i) {
        const T row_lse = softmax_row(s + i * r1, r0 + i + 1, r1);
        if (lse) lse[(b * Hq + h) * T_ + r0 + i] = row_lse;
      }
      gemm(false, false, rows, D, r1, T(1), s, r1, v_head, ldk, T(0),
           out + (b * T_ + r0) * ldq + h * D, ldq);
    }
  }
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, int64_t B, int64_t T_, int64_t Hq, int64_t Hkv,
                        int64_t D) {
  const int64_t group = Hq / Hkv;
  const int64_t blocks = (T_ + kAttentionBlock - 1) / kAttentionBlock;
  const int64_t ldq = Hq * D, ldk = Hkv * D;
  const T scale = T(1) / std::sqrt(T(D));
  // One task per (b, kv head): it owns that head's dk and dv rows, and its group's query
  // heads add into them in a fixed order, so no two threads touch the same gradient.
  // With fewer tasks than threads the region stays inactive and BLAS threads instead.
  const int64_t tasks = B * Hkv;
#pragma omp parallel if (tasks >= omp_get_max_threads())
  {
    std::vector<T> probs(static_cast<size_t>(kAttentionBlock * T_));
    std::vector<T> dprobs(probs.size());
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / Hkv, hk = task % Hkv;
      const T* k_head = k + b * T_ * ldk + hk * D;
      const T* v_head = v + b * T_ * ldk + hk * D;
      T* dk_head = dk + b * T_ * ldk + hk * D;
      T* dv_head = dv + b * T_ * ldk + hk * D;
      for (int64_t t = 0; t < T_; ++t) {
        std::fill(dk_head + t * ldk, dk_head + t * ldk + D, T(0));
        std::fill(dv_head + t * ldk, dv_head + t * ldk + D, T(0));
      }
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const T* lse_head = lse + (b * Hq + h) * T_;
        for (int64_t blk = 0; blk < blocks; ++blk) {
          const int64_t r0 = blk * kAttentionBlock, r1 = std::min(T_, r0 + kAttentionBlock);
          const int64_t rows = r1 - r0;
          const int64_t offset = (b * T_ + r0) * ldq + h * D;  // first row of this block
          T* p = probs.data();
          T* dp = dprobs.data();
          gemm(false, true, rows, r1, D, scale, q + offset, ldq, k_head, ldk, T(0), p, r1);
          gemm(false, true, rows, r1, D, T(1), dout + offset, ldq, v_head, ldk, T(0), dp, r1);
          for (int64_t i = 0; i < rows; ++i) {
            T* p_row = p + i * r1;
            T* dp_row = dp + i * r1;
            const int64_t valid = r0 + i + 1;
            const T row_lse = lse_head[r0 + i];
            const T* o_row = out + offset + i * ldq;
            const T* do_row = dout + offset + i * ldq;
            T d_i = 0;
#pragma omp simd reduction(+ : d_i)
            for (int64_t c = 0; c < D; ++c) d_i += do_row[c] * o_row[c];
#pragma omp simd
            for (int64_t j = 0; j < valid; ++j) {
              const T p_ij = exp_vec(p_row[j] - row_lse);
              p_row[j] = p_ij;
              dp_row[j] = p_ij * (dp_row[j] - d_i);
            }
            std::fill(p_row + valid, p_row + r1, T(0));
            std::fill(dp_row + valid, dp_row + r1, T(0));
          }
          gemm(false, false, rows, D, r1, scale, dp, r1, k_head, ldk, T(0), dq + offset, ldq);
          gemm(true, false, r1, D, rows, scale, dp, r1, q + offset, ldq, T(1), dk_head, ldk);
          gemm(true, false, r1, D, rows, T(1), p, r1, dout + offset, ldq, T(1), dv_head, ldk);
        }
      }
    }
  }
}

#define PENTAD_INSTANTIATE(T)                                                                 \
  template void attention_forward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t,  \
                                     int64_t, int64_t, int64_t);                              \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,     \
                                      const T*, const T*, int64_t, int64_t, int64_t, int64_t, \
                                      int64_t);
PENTAD_INSTANTIATE(float)
PENTAD_INSTANTIATE(double)
#undef PENTAD_INSTANTIATE

}  // namespace pentad::kernels::cpu
