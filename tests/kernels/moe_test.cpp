// The MoE permutation kernels against plain loops, and the weighted combine's backward
// against finite differences in double precision.
#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace pentad {
namespace {

using testing::randn;
using testing::view;

constexpr int64_t N = 13, K = 3, C = 7;

// pos of the picks of N tokens: rows 0..A-1 in a shuffled order, some picks dropped (-1).
std::vector<int32_t> picks(int64_t& A) {
  std::vector<int32_t> pos(static_cast<size_t>(N * K));
  A = 0;
  for (int64_t i = 0; i < N * K; ++i) pos[size_t(i)] = (i % 5 == 3) ? -1 : int32_t(A++);
  for (int64_t i = 0; i < N * K; ++i)  // a fixed permutation of the kept rows
    if (pos[size_t(i)] >= 0) pos[size_t(i)] = int32_t((pos[size_t(i)] * 7 + 3) % A);
  return pos;
}

TEST(Moe, PermuteGathersRows) {
  const std::vector<double> x = randn(N * C, 1);
  std::vector<int32_t> src = {4, 0, 12, 4, 7};
  std::vector<double> out(src.size() * C);
  kernels::moe_permute(view(out, {int64_t(src.size()), C}), view(x, {N, C}),
                       view(src, {int64_t(src.size())}));
  for (size_t a = 0; a < src.size(); ++a)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(out[a * C + size_t(c)], x[size_t(src[a] * C + c)]);
}

TEST(Moe, UnpermuteIsTheWeightedSumOfPicks) {
  int64_t A = 0;
  const std::vector<int32_t> pos = picks(A);
  const std::vector<double> y = randn(size_t(A * C), 2), w = randn(N * K, 3);
  std::vector<double> out(N * C, 5.0), want(N * C, 5.0);
  kernels::moe_unpermute(view(out, {N, C}), view(y, {A, C}), view(pos, {N, K}), view(w, {N, K}),
                         /*accumulate=*/true);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < K; ++j)
      if (const int32_t p = pos[size_t(t * K + j)]; p >= 0)
        for (int64_t c = 0; c < C; ++c)
          want[size_t(t * C + c)] += w[size_t(t * K + j)] * y[size_t(p * C + c)];
  EXPECT_LT(testing::rel_error(out, want), 1e-14);
  // Without weights and overwriting: the plain sum of the picks.
  kernels::moe_unpermute(view(out, {N, C}), view(y, {A, C}), view(pos, {N, K}), Tensor{}, false);
  double first = 0.0;
  for (int64_t j = 0; j < K; ++j)
    if (pos[size_t(j)] >= 0) first += y[size_t(pos[size_t(j)] * C)];
  EXPECT_DOUBLE_EQ(out[0], first);
}

TEST(Moe, UnpermuteBackwardMatchesFiniteDifferences) {
  int64_t A = 0;
  const std::vector<int32_t> pos = picks(A);
  std::vector<double> y = randn(size_t(A * C), 4), w = randn(N * K, 5);
  const std::vector<double> g = randn(N * C, 6);  // d(objective)/d(out)
  auto objective = [&] {
    std::vector<double> out(N * C);
    kernels::moe_unpermute(view(out, {N, C}), view(y, {A, C}), view(pos, {N, K}), view(w, {N, K}),
                           false);
    return testing::dot(out, g);
  };
  std::vector<double> dy(size_t(A * C), 9.0), dw(N * K, 9.0);
  kernels::moe_unpermute_backward(view(dy, {A, C}), view(dw, {N, K}), view(g, {N, C}),
                                  view(y, {A, C}), view(pos, {N, K}), view(w, {N, K}));
  testing::expect_gradient("y", y, dy, objective);
  testing::expect_gradient("w", w, dw, objective);
  for (int64_t i = 0; i < N * K; ++i) {
    if (pos[size_t(i)] < 0) {
      EXPECT_EQ(dw[size_t(i)], 0.0) << "a dropped pick has no weight gradient";
    }
  }
}

}  // namespace
}  // namespace pentad
