// The arithmetic of `pentad probe` (cli/probe.h): the rounds of pairs, the group shapes, and
// the islands found in bandwidth matrices with noise.
#include "cli/probe.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>
#include <vector>

namespace pentad::probe {
namespace {

TEST(Probe, RoundsCoverEveryPairOnceWithNoRankTwiceInARound) {
  for (int ranks : {1, 2, 3, 7, 8}) {
    std::set<std::pair<int, int>> seen;
    const auto rounds = pair_rounds(ranks);
    for (const auto& round : rounds) {
      std::set<int> busy;
      for (const auto& [a, b] : round) {
        EXPECT_LT(a, b);
        EXPECT_TRUE(busy.insert(a).second && busy.insert(b).second) << ranks << ": " << a;
        EXPECT_TRUE(seen.insert({a, b}).second) << ranks << ": " << a << "-" << b;
      }
    }
    EXPECT_EQ(int(seen.size()), ranks * (ranks - 1) / 2) << ranks;
    EXPECT_EQ(int(rounds.size()), ranks < 2 ? 0 : ranks % 2 ? ranks : ranks - 1) << ranks;
  }
}

TEST(Probe, GroupShapesAreTheMeshes) {
  using Shapes = std::vector<std::pair<int, int>>;
  EXPECT_EQ(group_shapes(8), (Shapes{{2, 1}, {2, 2}, {2, 4}, {4, 1}, {4, 2}, {8, 1}}));
  EXPECT_EQ(group_shapes(6), (Shapes{{2, 1}, {2, 3}, {3, 1}, {3, 2}, {6, 1}}));
  EXPECT_EQ(group_shapes(1), Shapes{});
}

TEST(Probe, IslandsSplitAtTheWidestGapOnly) {
  // Two nodes of three: 2 to 12 GB/s inside (noisy), 0.18 to 0.2 between.
  const int n = 6;
  std::vector<std::vector<double>> bw(n, std::vector<double>(n, 0.0));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j) bw[i][j] = (i / 3 == j / 3 ? 2e9 + 1e9 * ((i + 2 * j) % 11) : 0.18e9 + 1e6 * j);
  EXPECT_EQ(find_islands(bw), (std::vector<std::vector<int>>{{0, 1, 2}, {3, 4, 5}}));
  // Noise alone (a factor of 6, but no gap of 4) is one island.
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j) bw[i][j] = 2e9 + 1e9 * ((i + 2 * j) % 11);
  EXPECT_EQ(find_islands(bw), (std::vector<std::vector<int>>{{0, 1, 2, 3, 4, 5}}));
  // One rank behind a slow link: an island of its own.
  for (int j = 0; j < n; ++j)
    if (j != 4) bw[4][j] = bw[j][4] = 0.1e9;
  EXPECT_EQ(find_islands(bw), (std::vector<std::vector<int>>{{0, 1, 2, 3, 5}, {4}}));
  EXPECT_EQ(find_islands({{0.0}}), (std::vector<std::vector<int>>{{0}}));
  // A gap of 2.5 within one host (seen on 8 ranks over 2 cores) splits nothing.
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j) bw[i][j] = (i / 2 == j / 2 ? 30e9 : 12e9);
  EXPECT_EQ(find_islands(bw), (std::vector<std::vector<int>>{{0, 1, 2, 3, 4, 5}}));
}

}  // namespace
}  // namespace pentad::probe
