// How layers are cut into pipeline chunks (parallel/pp/layout.h): "balanced" against every cut
// of small models, and the cuts it gives where the head outweighs layers.
#include "parallel/pp/layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>

#include "core/check.h"

namespace pentad::parallel::pp {
namespace {

double most(const std::vector<double>& v) {
  return *std::max_element(v.begin(), v.end());
}
double squares(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0, [](double s, double x) { return s + x * x; });
}

// Every cut of n layers into `chunks` chunks of at least one layer.
void every_cut(int64_t n, int64_t chunks, std::vector<int64_t>& cut,
               const std::function<void(const std::vector<int64_t>&)>& visit) {
  if (chunks == 1) {
    cut.push_back(n);
    visit(cut);
    cut.pop_back();
    return;
  }
  for (int64_t first = 1; first <= n - (chunks - 1); ++first) {
    cut.push_back(first);
    every_cut(n - first, chunks - 1, cut, visit);
    cut.pop_back();
  }
}

TEST(ChunkLayers, ChunkCostsAddTheEndsExtras) {
  const LayerCosts costs{{1, 2, 3, 4, 5}, 0.5, 10};
  EXPECT_EQ(chunk_costs(costs, {2, 2, 1}), (std::vector<double>{3.5, 7, 15}));
  EXPECT_EQ(chunk_costs(costs, {5}), (std::vector<double>{25.5}));
}

TEST(ChunkLayers, BalancedIsTheLeastCostliestChunkThenTheMostEven) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> cost(0.5, 3.0), extra(0.0, 6.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 1 + int64_t(rng() % 9), chunks = 1 + int64_t(rng() % std::min<int64_t>(n, 4));
    LayerCosts costs;
    for (int64_t l = 0; l < n; ++l) costs.layers.push_back(cost(rng));
    costs.first = trial % 3 == 0 ? extra(rng) : 0.0;
    costs.last = extra(rng);
    double best_most = 1e300;
    std::vector<int64_t> cut;
    every_cut(n, chunks, cut, [&](const std::vector<int64_t>& c) {
      best_most = std::min(best_most, most(chunk_costs(costs, c)));
    });
    double best_squares = 1e300;
    every_cut(n, chunks, cut, [&](const std::vector<int64_t>& c) {
      const std::vector<double> v = chunk_costs(costs, c);
      if (most(v) <= best_most * (1 + 1e-9)) best_squares = std::min(best_squares, squares(v));
    });
    const std::vector<int64_t> got = balanced_chunk_layers(costs, chunks);
    ASSERT_EQ(int64_t(got.size()), chunks);
    EXPECT_EQ(std::accumulate(got.begin(), got.end(), int64_t{0}), n);
    for (int64_t l : got) EXPECT_GE(l, 1);
    const std::vector<double> v = chunk_costs(costs, got);
    EXPECT_NEAR(most(v), best_most, 1e-9 * best_most) << "trial " << trial;
    EXPECT_NEAR(squares(v), best_squares, 1e-9 * best_squares) << "trial " << trial;
  }
}

TEST(ChunkLayers, BalancedGivesTheHeadsChunkFewerLayers) {
  // 32 equal layers over 4 chunks, the head costing 2.1 layers: 9, 9, 8 and 6 + 2.1 (an even
  // split's last chunk costs 10.1).
  const LayerCosts costs{std::vector<double>(32, 1.0), 0.0, 2.1};
  const std::vector<int64_t> got = chunk_layers(32, 4, 1, "balanced", &costs);
  EXPECT_EQ(got.back(), 6);
  EXPECT_DOUBLE_EQ(most(chunk_costs(costs, got)), 9.0);
  std::vector<int64_t> rest(got.begin(), got.end() - 1);
  std::sort(rest.begin(), rest.end());
  EXPECT_EQ(rest, (std::vector<int64_t>{8, 9, 9}));
  // Without extras: the even split, and counts that do not divide are spread (an even split
  // refuses them).
  const LayerCosts plain{std::vector<double>(8, 1.0)};
  EXPECT_EQ(chunk_layers(8, 2, 2, "balanced", &plain), (std::vector<int64_t>{2, 2, 2, 2}));
  const LayerCosts ten{std::vector<double>(10, 1.0)};
  std::vector<int64_t> uneven = chunk_layers(10, 4, 1, "balanced", &ten);
  std::sort(uneven.begin(), uneven.end());
  EXPECT_EQ(uneven, (std::vector<int64_t>{2, 2, 3, 3}));
  EXPECT_THROW(chunk_layers(10, 4, 1, "", &ten), Error);
  // More chunks than layers is the user's error, named as before.
  EXPECT_THROW(chunk_layers(3, 4, 1, "balanced", &plain), Error);
  // The costs are the caller's to give.
  EXPECT_THROW(chunk_layers(8, 2, 1, "balanced"), std::logic_error);
}

}  // namespace
}  // namespace pentad::parallel::pp
