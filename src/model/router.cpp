// An MoE block's router (model/router.h): scores and top-k, the balancing losses'
// statistics, capacity and the permutation into expert order, on host arrays in fp32.
#include "model/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pentad::router {

float score_and_pick(const float* l, const float* bias, float* si, int32_t* pick, float* w,
                     std::vector<int64_t>& order, int64_t K, MoeScore score, bool renormalize) {
  const bool sigmoid = score == MoeScore::Sigmoid;
  const int64_t E = static_cast<int64_t>(order.size());
  float mx = l[0];
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) sum += std::exp(double(l[e]) - mx);
  const auto lse = static_cast<float>(mx + std::log(sum));
  for (int64_t e = 0; e < E; ++e)
    si[e] = sigmoid ? static_cast<float>(1.0 / (1.0 + std::exp(-double(l[e]))))
                    : static_cast<float>(std::exp(double(l[e]) - mx) / sum);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int64_t p, int64_t q) {
    const float vp = si[p] + bias[p], vq = si[q] + bias[q];
    return vp > vq || (vp == vq && p < q);
  });
  double picked = 0.0;
  for (int64_t j = 0; j < K; ++j) picked += si[order[size_t(j)]];
  for (int64_t j = 0; j < K; ++j) {
    const int64_t e = order[size_t(j)];
    pick[j] = static_cast<int32_t>(e);
    w[j] = renormalize ? static_cast<float>(si[e] / picked) : si[e];
  }
  return lse;
}

std::vector<float> balance_statistics(const float* s, const int32_t* pick,
                                      const std::vector<float>& lse, int64_t rows, int64_t E,
                                      int64_t K, int64_t b, int64_t t, int64_t row_start,
                                      MoeScore score) {
  const bool sigmoid = score == MoeScore::Sigmoid;
  std::vector<float> stats(static_cast<size_t>(2 * E + 2 * b * E + 1), 0.0f);
  float* cnt = stats.data();
  float* psum = cnt + E;
  float* scnt = psum + E;
  float* spsum = scnt + b * E;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t sq = (row_start + i) / t;
    const float* si = s + i * E;
    double norm = 1.0;
    if (sigmoid) norm = std::accumulate(si, si + E, 0.0);
    for (int64_t e = 0; e < E; ++e) {
      const float p = static_cast<float>(si[e] / norm);
      psum[e] += p;
      spsum[sq * E + e] += p;
    }
    for (int64_t j = 0; j < K; ++j) {
      cnt[pick[i * K + j]] += 1.0f;
      scnt[sq * E + pick[i * K + j]] += 1.0f;
    }
    stats.back() += lse[size_t(i)] * lse[size_t(i)];
  }
  return stats;
}

BalanceLosses balance_losses(const std::vector<float>& stats, const MoeConfig& moe, int64_t E,
                             int64_t K, int64_t b, int64_t T) {
  const float* cnt = stats.data();
  const float* psum = cnt + E;
  const float* scnt = psum + E;
  const float* spsum = scnt + b * E;
  const int64_t N = b * T;  // the micro-batch's tokens
  const bool aux = moe.aux_loss_coef > 0, seq = moe.seq_aux_loss_coef > 0;
  const double kT = double(K) * double(N) * double(N), kt = double(K) * double(T) * double(T);
  BalanceLosses out;
  out.aux_coef.assign(size_t(E), 0.0);
  out.seq_coef.assign(size_t(b * E), 0.0);
  for (int64_t e = 0; e < E; ++e) {
    if (aux) out.aux_coef[size_t(e)] = moe.aux_loss_coef * double(E) / kT * cnt[e];
    out.aux += out.aux_coef[size_t(e)] * psum[e];
    for (int64_t q = 0; q < b; ++q) {
      const size_t qe = size_t(q * E + e);
      if (seq) out.seq_coef[qe] = moe.seq_aux_loss_coef / double(b) * double(E) / kt * scnt[qe];
      out.seq_aux += out.seq_coef[qe] * spsum[qe];
    }
  }
  out.z = moe.z_loss_coef * double(stats.back()) / double(N);
  return out;
}

void drop_over_capacity(const std::vector<float>& all, const std::vector<int64_t>& mine, int64_t N,
                        int64_t K, int64_t E, double factor, std::vector<uint8_t>& kept) {
  const auto capacity = static_cast<int64_t>(std::ceil(factor * double(N) * double(K) / double(E)));
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(E));
  for (int64_t g = 0; g < N * K; ++g) by_expert[size_t(all[size_t(2 * g)])].push_back(g);
  for (std::vector<int64_t>& picks : by_expert) {
    if (int64_t(picks.size()) <= capacity) continue;
    // Highest score first; ties: earlier token, then earlier pick (g's order).
    std::stable_sort(picks.begin(), picks.end(), [&](int64_t p, int64_t q) {
      return all[size_t(2 * p + 1)] > all[size_t(2 * q + 1)];
    });
    for (size_t d = size_t(capacity); d < picks.size(); ++d) {
      const int64_t row = mine[size_t(picks[d] / K)];
      if (row >= 0) kept[size_t(row * K + picks[d] % K)] = 0;
    }
  }
}

std::vector<int64_t> count_by_expert(const int32_t* pick, const std::vector<uint8_t>& kept,
                                     int64_t n, int64_t E) {
  std::vector<int64_t> counts(size_t(E), 0);
  for (int64_t i = 0; i < n; ++i)
    if (kept[size_t(i)]) ++counts[size_t(pick[i])];
  return counts;
}

void expert_order(const int32_t* pick, const std::vector<uint8_t>& kept, int64_t n, int64_t K,
                  const std::vector<int64_t>& counts, int32_t* pos, int32_t* src) {
  const size_t E = counts.size();
  std::vector<int64_t> next(E, 0);
  for (size_t e = 1; e < E; ++e) next[e] = next[e - 1] + counts[e - 1];
  for (int64_t i = 0; i < n; ++i) {
    if (!kept[size_t(i)]) {
      pos[i] = -1;
      continue;
    }
    const int64_t slot = next[size_t(pick[i])]++;
    pos[i] = static_cast<int32_t>(slot);
    src[slot] = static_cast<int32_t>(i / K);
  }
}

}  // namespace pentad::router
