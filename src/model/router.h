#pragma once
// An MoE block's router, apart from its experts and their dispatch (as Megatron-Core's
// moe/router.py): host logic in fp32 on plain arrays, each step its own function, so that
// a table of logits can test it. moe.h states the formulas; MoeBlock::route composes these
// in order: score and pick (score_and_pick), the balancing losses' statistics
// (balance_statistics, summed over the micro-batch's ranks, then balance_losses), the
// capacity drops (drop_over_capacity) and the permutation into expert order
// (count_by_expert, expert_order).
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace pentad::router {

// One token's routing from its router logits l (E): scores s (E), the top k of s + bias
// (ties to the lower index) into pick (k) and their weights into w (k); returns the logits'
// logsumexp. order: scratch of E entries.
float score_and_pick(const float* l, const float* bias, float* s, int32_t* pick, float* w,
                     std::vector<int64_t>& order, int64_t k, MoeScore score, bool renormalize);

// The balancing losses' statistics of `rows` routed rows (s (rows, E), pick (rows, k), lse
// (rows)), row i being row row_start + i of the micro-batch's b sequences of t tokens:
// [counts (E), p sums (E), per sequence: counts (b, E), p sums (b, E), sum of lse^2].
std::vector<float> balance_statistics(const float* s, const int32_t* pick,
                                      const std::vector<float>& lse, int64_t rows, int64_t E,
                                      int64_t k, int64_t b, int64_t t, int64_t row_start,
                                      MoeScore score);

// The losses of one micro-batch of b sequences of T tokens, from its statistics summed over
// its ranks: each loss's value and d loss / d p[t, e] (aux: E values; seq_aux: (b, E)).
struct BalanceLosses {
  std::vector<double> aux_coef, seq_coef;
  double aux = 0, seq_aux = 0, z = 0;
};
BalanceLosses balance_losses(const std::vector<float>& stats, const MoeConfig& moe, int64_t E,
                             int64_t k, int64_t b, int64_t T);

// Capacity over a micro-batch of N tokens: `all` holds [expert, score] of each of its N x k
// picks (token-major), mine[token] the row held here (-1: another rank's). Each expert keeps
// at most ceil(factor N k / E) picks, of highest score (ties: earlier token, then earlier
// pick); kept (rows x k) is cleared for the dropped picks of the rows held here.
void drop_over_capacity(const std::vector<float>& all, const std::vector<int64_t>& mine, int64_t N,
                        int64_t k, int64_t E, double factor, std::vector<uint8_t>& kept);

// Picks (n of them) kept, per expert (E values).
std::vector<int64_t> count_by_expert(const int32_t* pick, const std::vector<uint8_t>& kept,
                                     int64_t n, int64_t E);
// Expert order, a counting sort by expert, then row and pick: pos (n) each pick's slot (-1:
// dropped), src (slots) each slot's row (pick / k); counts from count_by_expert.
void expert_order(const int32_t* pick, const std::vector<uint8_t>& kept, int64_t n, int64_t k,
                  const std::vector<int64_t>& counts, int32_t* pos, int32_t* src);

}  // namespace pentad::router
