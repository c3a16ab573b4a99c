#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace pentad {
namespace {

using namespace testing;
namespace k = kernels;

TEST(Add, MatchesNaiveAndMayAlias) {
  const int64_t n = 100003;
  const auto a = to_float(randn(n, 1)), b = to_float(randn(n, 2));
  std::vector<float> out(n);
  k::add(view(out, {n}), view(a, {n}), view(b, {n}));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]);
  auto a2 = a;
  k::add(view(a2, {n}), view(a2, {n}), view(b, {n}));
  EXPECT_TRUE(bitwise_equal(a2, out));
}

TEST(Scale, MultipliesInPlace) {
  auto x = randn(1001, 3);
  const auto x0 = x;
  k::scale(view(x, {7, 11, 13}), 0.5f);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], x0[i] * 0.5);
}

// 1e8 + many small squares: float accumulation would lose the small ones entirely.
TEST(SumSquares, AccumulatesInDoubleAndIsDeterministic) {
  const int64_t n = 1 << 20;
  std::vector<float> x(n, 1e-3f);
  x[0] = 1e4f;
  const double ref = 1e8 + double(n - 1) * double(1e-3f) * double(1e-3f);  // 1e8 + 1.05
  const double got = k::sum_squares(view(x, {n}));
  EXPECT_NEAR(got, ref, 1e-3);
  EXPECT_EQ(got, k::sum_squares(view(x, {n})));
  const auto y = randn(777, 4);
  EXPECT_NEAR(k::sum_squares(view(y, {777})), dot(y, y), 1e-10);
}

// The device accumulators' CPU side: added into, in double; the squares as sum_squares.
TEST(SumInto, AddsScaledSumsAndSquaresIntoTotal) {
  const auto x = to_float(randn(1001, 5));
  double totals[2] = {0.5, -2.0};
  const Tensor sum_total = view_of(&totals[0], {1}, DType::F64);
  const Tensor squares_total = view_of(&totals[1], {1}, DType::F64);
  k::sum_into(sum_total, view(x, {1001}), 0.25);
  k::sum_squares_into(squares_total, view(x, {1001}));
  double sum = 0.0;
  for (float v : x) sum += v;
  EXPECT_NEAR(totals[0], 0.5 + 0.25 * sum, 1e-12 * 1001);
  EXPECT_EQ(totals[1], -2.0 + k::sum_squares(view(x, {1001})));
  EXPECT_ANY_THROW(k::sum_into(view_of(&totals[0], {1}, DType::F32), view(x, {1001})));
}

// Two steps of torch.optim.AdamW(lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
// on p = 1 with gradients 0.5 then -0.25, by hand:
//  step 1: p = 0.999; m = 0.05; v = 2.5e-4; step_size = 0.1 / 0.1 = 1;
//          denom = sqrt(2.5e-4) / sqrt(1e-3) + 1e-8 = 0.5 + 1e-8; p = 0.999 - 0.05 / denom
//  step 2: p *= 0.999; m = 0.02; v = 3.1225e-4; step_size = 0.1 / 0.19;
//          denom = sqrt(3.1225e-4) / sqrt(1.999e-3) + 1e-8; p -= step_size * m / denom
TEST(AdamW, TwoStepsMatchHandComputedTorchValues) {
  const double p1 = 0.999 - 0.05 / (0.5 + 1e-8);
  const double p2 = p1 * 0.999 - (0.1 / 0.19) * 0.02 / (std::sqrt(3.1225e-4 / 1.999e-3) + 1e-8);
  EXPECT_NEAR(p1, 0.89900000199999996, 1e-12);  // the arithmetic above, spelled out
  std::vector<double> p = {1.0}, m = {0.0}, v = {0.0}, g = {0.5};
  k::adamw_update(view(p, {1}), view(m, {1}), view(v, {1}), view(g, {1}), 0.1f, 0.9f, 0.999f, 1e-8f,
                  0.01f, 1);
  // The F64 path rounds the float hyperparameters, so allow their representation error.
  EXPECT_NEAR(p[0], p1, 1e-7);
  EXPECT_NEAR(m[0], 0.05, 1e-7);
  EXPECT_NEAR(v[0], 2.5e-4, 1e-8);
  g[0] = -0.25;
  k::adamw_update(view(p, {1}), view(m, {1}), view(v, {1}), view(g, {1}), 0.1f, 0.9f, 0.999f, 1e-8f,
                  0.01f, 2);
  EXPECT_NEAR(p[0], p2, 1e-7);
  EXPECT_NEAR(m[0], 0.02, 1e-7);
  EXPECT_NEAR(v[0], 3.1225e-4, 1e-8);

  // The float path over many elements agrees with the double one.
  const int64_t n = 4097;
  auto pd = randn(n, 5), gd = randn(n, 6);
  std::vector<double> md(n, 0.0), vd(n, 0.0);
  auto pf = to_float(pd), gf = to_float(gd);
  std::vector<float> mf(n, 0.0f), vf(n, 0.0f);
  for (int64_t step = 1; step <= 3; ++step) {
    k::adamw_update(view(pd, {n}), view(md, {n}), view(vd, {n}), view(gd, {n}), 1e-3f, 0.9f, 0.95f,
                    1e-8f, 0.1f, step);
    k::adamw_update(view(pf, {n}), view(mf, {n}), view(vf, {n}), view(gf, {n}), 1e-3f, 0.9f, 0.95f,
                    1e-8f, 0.1f, step);
  }
  EXPECT_LT(rel_error(pf, pd), 1e-6);
}

}  // namespace
}  // namespace pentad
