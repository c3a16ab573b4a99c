// The MoE router (model/router.h) on tables of logits: picks, weights and logsumexp; the
// balancing losses; capacity drops; the permutation into expert order.
#include "model/router.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

using namespace pentad;

namespace {

struct PickCase {
  const char* what;
  std::vector<float> logits, bias;
  int64_t k;
  MoeScore score;
  bool renormalize;
  std::vector<int32_t> pick;
  std::vector<float> w;  // expected weights
};

float softmax_of(const std::vector<float>& l, size_t e) {
  double sum = 0;
  for (float v : l) sum += std::exp(double(v));
  return float(std::exp(double(l[e])) / sum);
}

}  // namespace

TEST(Router, ScoresPicksAndWeights) {
  const std::vector<float> l = {1, 3, 2, 0};
  const float s1 = softmax_of(l, 1), s2 = softmax_of(l, 2), s3 = softmax_of(l, 3);
  const float sig2 = float(1 / (1 + std::exp(-2.0)));
  const auto softmax = MoeScore::Softmax, sigmoid = MoeScore::Sigmoid;
  const std::vector<PickCase> cases = {
      // what, logits, bias, k, score, renormalize, picks, weights
      {"softmax top 2, renormalised",
       l,
       {0, 0, 0, 0},
       2,
       softmax,
       true,
       {1, 2},
       {s1 / (s1 + s2), s2 / (s1 + s2)}},
      {"softmax top 2, not renormalised", l, {0, 0, 0, 0}, 2, softmax, false, {1, 2}, {s1, s2}},
      {"ties go to the lower index",
       {0, 0, 0, 0},
       {0, 0, 0, 0},
       2,
       softmax,
       true,
       {0, 1},
       {0.5f, 0.5f}},
      {"the bias steers the pick, not the weight",
       l,
       {0, 0, 0, 5},
       2,
       softmax,
       true,
       {3, 1},
       {s3 / (s3 + s1), s1 / (s3 + s1)}},
      {"sigmoid top 1", {0, 2, -2}, {0, 0, 0}, 1, sigmoid, false, {1}, {sig2}},
  };
  for (const PickCase& c : cases) {
    const size_t E = c.logits.size();
    std::vector<float> s(E), w(size_t(c.k));
    std::vector<int32_t> pick(size_t(c.k));
    std::vector<int64_t> order(E);
    const float lse = router::score_and_pick(c.logits.data(), c.bias.data(), s.data(), pick.data(),
                                             w.data(), order, c.k, c.score, c.renormalize);
    double sum = 0;
    for (float v : c.logits) sum += std::exp(double(v));
    EXPECT_NEAR(lse, std::log(sum), 1e-6) << c.what;
    EXPECT_EQ(pick, c.pick) << c.what;
    for (size_t j = 0; j < w.size(); ++j) EXPECT_NEAR(w[j], c.w[j], 1e-6) << c.what << " w" << j;
  }
}

// aux = coef E / (k T^2) sum_e count_e sum_t p[t, e]: coef when balanced, more when not;
// z = coef / T sum_t lse_t^2.
TEST(Router, BalancingLosses) {
  struct Case {
    const char* what;
    std::vector<float> logits;  // (T, 2)
    double aux;                 // for aux_loss_coef = 0.01
  };
  const std::vector<Case> cases = {
      {"balanced: each expert one token", {1, 0, 0, 1}, 0.01},
      // Both pick expert 0 (a tie picks the lower index); p sums 0.5 + 0.75, 0.5 + 0.25.
      {"both tokens on one expert", {0, 0, std::log(3.0f), 0}, 0.01 * 2.0 / 4.0 * 2 * 1.25},
  };
  MoeConfig moe;
  moe.aux_loss_coef = 0.01f;
  moe.z_loss_coef = 0.1f;
  const int64_t E = 2, k = 1, b = 1, T = 2;
  for (const Case& c : cases) {
    std::vector<float> s(static_cast<size_t>(T * E)), w(static_cast<size_t>(T)),
        lse(static_cast<size_t>(T)), bias(static_cast<size_t>(E), 0);
    std::vector<int32_t> pick(static_cast<size_t>(T));
    std::vector<int64_t> order(static_cast<size_t>(E));
    for (int64_t t = 0; t < T; ++t)
      lse[size_t(t)] =
          router::score_and_pick(c.logits.data() + t * E, bias.data(), s.data() + t * E,
                                 pick.data() + t, w.data() + t, order, k, MoeScore::Softmax, true);
    const std::vector<float> stats =
        router::balance_statistics(s.data(), pick.data(), lse, T, E, k, b, T, 0, MoeScore::Softmax);
    const router::BalanceLosses losses = router::balance_losses(stats, moe, E, k, b, T);
    EXPECT_NEAR(losses.aux, c.aux, 1e-7) << c.what;
    EXPECT_NEAR(losses.z, 0.1 / T * (lse[0] * lse[0] + lse[1] * lse[1]), 1e-6) << c.what;
    EXPECT_EQ(losses.seq_aux, 0.0) << c.what;  // seq_aux_loss_coef = 0
    ASSERT_EQ(losses.aux_coef.size(), size_t(E));
  }
}

// Capacity ceil(f N k / E): the picks of highest score stay, ties to the earlier token.
TEST(Router, CapacityDropsTheLowestScores) {
  struct Case {
    const char* what;
    std::vector<float> scores;  // N tokens, k = 1, all on expert 0 of 2
    std::vector<uint8_t> kept;
  };
  const std::vector<Case> cases = {
      {"highest scores stay", {0.9f, 0.6f, 0.8f, 0.7f}, {1, 0, 1, 0}},
      {"ties keep the earlier tokens", {0.5f, 0.5f, 0.5f, 0.5f}, {1, 1, 0, 0}},
  };
  const int64_t N = 4, k = 1, E = 2;
  for (const Case& c : cases) {
    std::vector<float> all;
    for (float s : c.scores) all.insert(all.end(), {0.0f, s});
    const std::vector<int64_t> mine = {0, 1, 2, 3};
    std::vector<uint8_t> kept(static_cast<size_t>(N), 1);
    router::drop_over_capacity(all, mine, N, k, E, 1.0, kept);  // capacity 2
    EXPECT_EQ(kept, c.kept) << c.what;
  }
}

// Expert order: by expert, then row and pick; a dropped pick has no slot.
TEST(Router, PermutationIntoExpertOrder) {
  const std::vector<int32_t> pick = {1, 0, 1, 2, 0, 1};  // 3 rows x k = 2
  const std::vector<uint8_t> kept = {1, 1, 1, 0, 1, 1};
  const std::vector<int64_t> counts = router::count_by_expert(pick.data(), kept, 6, 3);
  EXPECT_EQ(counts, (std::vector<int64_t>{2, 3, 0}));
  std::vector<int32_t> pos(6), src(5);
  router::expert_order(pick.data(), kept, 6, 2, counts, pos.data(), src.data());
  EXPECT_EQ(pos, (std::vector<int32_t>{2, 0, 3, -1, 1, 4}));
  EXPECT_EQ(src, (std::vector<int32_t>{0, 2, 0, 1, 2}));
}
