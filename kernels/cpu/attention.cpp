#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/cpu/common.h"

// Layout: q, out, dq, dout are (B, Tq, Hq, D) so the rows of one head are D values apart by
// Hq * D (ldq); k, v likewise with ldk = Hkv * D. Every gemm below reads the heads in place
// through these leading dimensions; nothing is transposed or copied.
//
// Query i sees the keys [0, n_i), n_i = #{j : k_pos[j] <= q_pos[i]} (a prefix, as k_pos
// ascends; n_i = i + 1 without positions). Per (b, h) and block of query rows [r0, r1) (at
// most kAttentionBlock rows of consecutive positions: a block never spans a jump, such as
// the one between a zig-zag rank's two chunks, whose later chunk sees many more keys), the
// block's widest prefix is n = n_{r1-1} (q_pos ascends too), and:
//   S (rows, n) = scale * Q_blk K^T      P = softmax(S) with j >= n_i masked to 0
//   O_blk = P V                          lse_i = log sum_j exp(S_ij)
// Backward recomputes P = exp(S - lse) and, with D_i = dO_i . O_i,
//   dP = dO_blk V^T    dS = P * (dP - D)    dQ_blk = scale dS K
//   dK[0, n) += scale dS^T Q_blk         dV[0, n) += P^T dO_blk
// Work is proportional to the visible (query, key) pairs, whichever positions a rank holds
// (zig-zag context parallelism); without positions the arithmetic is the plain causal one.
namespace pentad::kernels::cpu {

namespace {

template <typename T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// Softmax of one score row in place over keys [0, valid), zeroing [valid, width); returns
// the row's log-sum-exp (-inf for a row that sees no key).
template <typename T>
T softmax_row(T* row, int64_t valid, int64_t width) {
  if (valid == 0) {
    std::fill(row, row + width, T(0));
    return kNegInf<T>;
  }
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

// n_i, the number of keys query i sees, for every query row.
std::vector<int64_t> visible_keys(const int32_t* q_pos, const int32_t* k_pos, int64_t Tq,
                                  int64_t Tk) {
  std::vector<int64_t> n(static_cast<size_t>(Tq));
  for (int64_t i = 0; i < Tq; ++i)
    n[static_cast<size_t>(i)] =
        q_pos ? std::upper_bound(k_pos, k_pos + Tk, q_pos[i]) - k_pos : std::min(i + 1, Tk);
  return n;
}

// The query row blocks [r0, r1): kAttentionBlock rows at most, cut wherever the positions
// jump.
std::vector<std::pair<int64_t, int64_t>> row_blocks(const int32_t* q_pos, int64_t Tq) {
  std::vector<std::pair<int64_t, int64_t>> blocks;
  for (int64_t r0 = 0; r0 < Tq;) {
    const int64_t end = std::min(Tq, r0 + kAttentionBlock);
    int64_t r1 = r0 + 1;
    while (r1 < end && (!q_pos || q_pos[r1] == q_pos[r1 - 1] + 1)) ++r1;
    blocks.emplace_back(r0, r1);
    r0 = r1;
  }
  return blocks;
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const int32_t* q_pos,
                       const int32_t* k_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq,
                       int64_t Hkv, int64_t D) {
  const int64_t group = Hq / Hkv;
  const std::vector<std::pair<int64_t, int64_t>> row_block = row_blocks(q_pos, Tq);
  const int64_t blocks = int64_t(row_block.size());
  const int64_t ldq = Hq * D, ldk = Hkv * D;
  const T scale = T(1) / std::sqrt(T(D));
  const std::vector<int64_t> visible = visible_keys(q_pos, k_pos, Tq, Tk);
#pragma omp parallel
  {
    std::vector<T> scores(static_cast<size_t>(kAttentionBlock * Tk));
    // Tasks are independent (each writes its own rows of out and lse); the cyclic
    // schedule interleaves short early blocks with long late ones across threads.
#pragma omp for schedule(static, 1)
    for (int64_t task = 0; task < B * Hq * blocks; ++task) {
      const int64_t blk = task % blocks, h = task / blocks % Hq, b = task / (blocks * Hq);
      const auto [r0, r1] = row_block[size_t(blk)];
      const int64_t rows = r1 - r0, hk = h / group, width = visible[r1 - 1];
      const T* q_blk = q + (b * Tq + r0) * ldq + h * D;
      const T* k_head = k + b * Tk * ldk + hk * D;
      const T* v_head = v + b * Tk * ldk + hk * D;
      T* out_blk = out + (b * Tq + r0) * ldq + h * D;
      T* lse_blk = lse ? lse + (b * Hq + h) * Tq + r0 : nullptr;
      if (width == 0) {  // no row of the block sees a key
        for (int64_t i = 0; i < rows; ++i)
          std::fill(out_blk + i * ldq, out_blk + i * ldq + D, T(0));
        if (lse_blk) std::fill(lse_blk, lse_blk + rows, kNegInf<T>);
        continue;
      }
      T* s = scores.data();
      gemm(false, true, rows, width, D, scale, q_blk, ldq, k_head, ldk, T(0), s, width);
      for (int64_t i = 0; i < rows; ++i) {
        const T row_lse = softmax_row(s + i * width, visible[r0 + i], width);
        if (lse_blk) lse_blk[i] = row_lse;
      }
      gemm(false, false, rows, D, width, T(1), s, width, v_head, ldk, T(0), out_blk, ldq);
    }
  }
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const int32_t* q_pos, const int32_t* k_pos,
                        int64_t B, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv, int64_t D,
                        bool accumulate) {
  const int64_t group = Hq / Hkv;
  const int64_t ldq = Hq * D, ldk = Hkv * D;
  const T scale = T(1) / std::sqrt(T(D));
  const T dq_beta = accumulate ? T(1) : T(0);
  const std::vector<int64_t> visible = visible_keys(q_pos, k_pos, Tq, Tk);
  const std::vector<std::pair<int64_t, int64_t>> row_block = row_blocks(q_pos, Tq);
  // One task per (b, kv head): it owns that head's dk and dv rows, and its group's query
  // heads add into them in a fixed order, so no two threads touch the same gradient.
  // With fewer tasks than threads the region stays inactive and BLAS threads instead.
  const int64_t tasks = B * Hkv;
#pragma omp parallel if (tasks >= omp_get_max_threads())
  {
    std::vector<T> probs(static_cast<size_t>(kAttentionBlock * Tk));
    std::vector<T> dprobs(probs.size());
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / Hkv, hk = task % Hkv;
      const T* k_head = k + b * Tk * ldk + hk * D;
      const T* v_head = v + b * Tk * ldk + hk * D;
      T* dk_head = dk + b * Tk * ldk + hk * D;
      T* dv_head = dv + b * Tk * ldk + hk * D;
      if (!accumulate)
        for (int64_t t = 0; t < Tk; ++t) {
          std::fill(dk_head + t * ldk, dk_head + t * ldk + D, T(0));
          std::fill(dv_head + t * ldk, dv_head + t * ldk + D, T(0));
        }
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const T* lse_head = lse + (b * Hq + h) * Tq;
        for (const auto& [r0, r1] : row_block) {
          const int64_t rows = r1 - r0, width = visible[r1 - 1];
          const int64_t offset = (b * Tq + r0) * ldq + h * D;  // first row of this block
          if (width == 0) {                                    // no row sees a key: no gradient
            if (!accumulate)
              for (int64_t i = 0; i < rows; ++i)
                std::fill(dq + offset + i * ldq, dq + offset + i * ldq + D, T(0));
            continue;
          }
          T* p = probs.data();
          T* dp = dprobs.data();
          gemm(false, true, rows, width, D, scale, q + offset, ldq, k_head, ldk, T(0), p, width);
          gemm(false, true, rows, width, D, T(1), dout + offset, ldq, v_head, ldk, T(0), dp, width);
          for (int64_t i = 0; i < rows; ++i) {
            T* p_row = p + i * width;
            T* dp_row = dp + i * width;
            const T row_lse = lse_head[r0 + i];
            // A row no key of any block saw (lse = -inf) has P = 0.
            const int64_t valid = row_lse == kNegInf<T> ? 0 : visible[r0 + i];
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
            std::fill(p_row + valid, p_row + width, T(0));
            std::fill(dp_row + valid, dp_row + width, T(0));
          }
          gemm(false, false, rows, D, width, scale, dp, width, k_head, ldk, dq_beta, dq + offset,
               ldq);
          gemm(true, false, width, D, rows, scale, dp, width, q + offset, ldq, T(1), dk_head, ldk);
          gemm(true, false, width, D, rows, T(1), p, width, dout + offset, ldq, T(1), dv_head, ldk);
        }
      }
    }
  }
}

template <typename T>
void attention_merge(T* out, T* lse, const T* block_out, const T* block_lse, int64_t B, int64_t T_,
                     int64_t H, int64_t D) {
#pragma omp parallel for schedule(static) if (B * T_ * H * D >= kParallelMin)
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    const int64_t b = bt / T_, t = bt % T_;
    for (int64_t h = 0; h < H; ++h) {
      T& row_lse = lse[(b * H + h) * T_ + t];
      const T add_lse = block_lse[(b * H + h) * T_ + t];
      T* o = out + (bt * H + h) * D;
      const T* add = block_out + (bt * H + h) * D;
      if (add_lse == kNegInf<T>) continue;  // the block saw no key for this row
      if (row_lse == kNegInf<T>) {          // nothing seen before it
        std::copy(add, add + D, o);
        row_lse = add_lse;
        continue;
      }
      const T hi = std::max(row_lse, add_lse), lo = std::min(row_lse, add_lse);
      const T merged = hi + std::log1p(std::exp(lo - hi));
      const T keep = std::exp(row_lse - merged), take = std::exp(add_lse - merged);
#pragma omp simd
      for (int64_t c = 0; c < D; ++c) o[c] = o[c] * keep + add[c] * take;
      row_lse = merged;
    }
  }
}

#define PENTAD_INSTANTIATE(T)                                                                      \
  template void attention_forward<T>(T*, T*, const T*, const T*, const T*, const int32_t*,         \
                                     const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t,  \
                                     int64_t);                                                     \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,          \
                                      const T*, const T*, const int32_t*, const int32_t*, int64_t, \
                                      int64_t, int64_t, int64_t, int64_t, int64_t, bool);          \
  template void attention_merge<T>(T*, T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t);
PENTAD_INSTANTIATE(float)
PENTAD_INSTANTIATE(double)
#undef PENTAD_INSTANTIATE

}  // namespace pentad::kernels::cpu
