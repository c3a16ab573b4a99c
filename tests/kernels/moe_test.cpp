// The MoE permutation kernels against plain loops, the weighted combine's backward against
// finite differences in double precision, and the grouped expert GEMMs against one linear
// layer per expert.
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

// The grouped linear layers against one linear layer per group, on uneven groups (one
// empty), in double and in float: equal to rounding.
template <typename T>
void check_grouped_linear(double tol) {
  const std::vector<int64_t> rows = {9, 0, 2, 17};
  const int64_t G = 4, R = 28, IC = 5, OC = 6;
  auto make = [](size_t n, uint64_t seed) {
    std::vector<T> out;
    for (double v : randn(n, seed)) out.push_back(T(v));
    return out;
  };
  const std::vector<T> x = make(size_t(R * IC), 6), dy = make(size_t(R * OC), 7);
  std::vector<std::vector<T>> w, b, dw, db, dw_want, db_want;
  std::vector<Tensor> wt, bt, dwt, dbt;
  for (int64_t g = 0; g < G; ++g) {
    w.push_back(make(size_t(OC * IC), 10 + uint64_t(g)));
    b.push_back(make(size_t(OC), 20 + uint64_t(g)));
    dw.push_back(make(size_t(OC * IC), 30 + uint64_t(g)));  // gradients accumulate
    db.push_back(make(size_t(OC), 40 + uint64_t(g)));
  }
  dw_want = dw;
  db_want = db;
  for (int64_t g = 0; g < G; ++g) {
    wt.push_back(view(w[size_t(g)], {OC, IC}));
    bt.push_back(view(b[size_t(g)], {OC}));
    dwt.push_back(view(dw[size_t(g)], {OC, IC}));
    dbt.push_back(view(db[size_t(g)], {OC}));
  }
  std::vector<T> y(size_t(R * OC)), y_want(y.size()), dx(size_t(R * IC), T(1)), dx_want(dx);
  kernels::grouped_linear_forward(view(y, {R, OC}), view(x, {R, IC}), rows, wt, bt);
  kernels::grouped_linear_backward(view(dx, {R, IC}), dwt, dbt, view(dy, {R, OC}), view(x, {R, IC}),
                                   rows, wt, /*accumulate_dinp=*/true);
  int64_t start = 0;
  for (int64_t g = 0; g < G; start += rows[size_t(g)], ++g) {
    const int64_t n = rows[size_t(g)];
    if (n == 0) continue;
    auto part = [&](std::vector<T>& v, int64_t width) {
      return view(v, {R, width}).rows(start, n);
    };
    std::vector<T> xs(x), dys(dy);
    kernels::linear_forward(part(y_want, OC), part(xs, IC), wt[size_t(g)], bt[size_t(g)]);
    kernels::linear_backward(part(dx_want, IC), view(dw_want[size_t(g)], {OC, IC}),
                             view(db_want[size_t(g)], {OC}), part(dys, OC), part(xs, IC),
                             wt[size_t(g)], true);
  }
  EXPECT_LE(testing::rel_error(y, y_want), tol);
  EXPECT_LE(testing::rel_error(dx, dx_want), tol);
  for (int64_t g = 0; g < G; ++g) {
    EXPECT_LE(testing::rel_error(dw[size_t(g)], dw_want[size_t(g)]), tol) << "group " << g;
    EXPECT_LE(testing::rel_error(db[size_t(g)], db_want[size_t(g)]), tol) << "group " << g;
  }
  // The empty group's gradients are untouched.
  EXPECT_EQ(dw[1], dw_want[1]);
}

TEST(Moe, GroupedLinearIsOneLinearPerGroup) {
  check_grouped_linear<double>(1e-14);
  check_grouped_linear<float>(1e-6);
}

TEST(Moe, GroupedLinearRefusesRowsThatDoNotAddUp) {
  const std::vector<double> x = randn(10, 1), w = randn(4, 2);
  std::vector<double> y(8);
  const std::vector<int64_t> rows = {3, 1};  // 4 rows, but x has 5
  const std::vector<Tensor> weights = {view(w, {2, 2}), view(w, {2, 2})};
  EXPECT_THROW(kernels::grouped_linear_forward(view(y, {4, 2}), view(x, {5, 2}), rows, weights, {}),
               std::logic_error);
}

}  // namespace
}  // namespace pentad
