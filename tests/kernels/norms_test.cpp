#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace pentad {
namespace {

using namespace testing;
namespace k = kernels;

struct NormShape {
  int64_t N, C;
};
const NormShape kShapes[] = {{5, 7}, {1, 1}, {64, 768}, {17, 33}};

// LayerNorm in double: out, mean, rstd.
void naive_layernorm(std::vector<double>& out, std::vector<double>& mean, std::vector<double>& rstd,
                     const std::vector<double>& x, const std::vector<double>& w,
                     const std::vector<double>* b, int64_t N, int64_t C, double eps) {
  for (int64_t n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int64_t c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    const double s = 1 / std::sqrt(v / C + eps);
    for (int64_t c = 0; c < C; ++c)
      out[n * C + c] = (x[n * C + c] - m) * s * w[c] + (b ? (*b)[c] : 0.0);
    mean[n] = m, rstd[n] = s;
  }
}

TEST(LayerNorm, ForwardMatchesNaiveInFloat) {
  for (NormShape s : kShapes) {
    for (bool with_bias : {true, false}) {
      // An offset mean checks the variance is not computed as E[x^2] - E[x]^2.
      auto x = randn(s.N * s.C, 1);
      for (double& v : x) v += 50.0;
      const auto w = randn(s.C, 2), b = randn(s.C, 3);
      const auto xf = to_float(x), wf = to_float(w), bf = to_float(b);
      std::vector<float> out(s.N * s.C), mean(s.N), rstd(s.N);
      k::layernorm_forward(view(out, {s.N, s.C}), view(mean, {s.N}), view(rstd, {s.N}),
                           view(xf, {s.N, s.C}), view(wf, {s.C}),
                           with_bias ? view(bf, {s.C}) : Tensor{}, 1e-5f);
      std::vector<double> ro(s.N * s.C), rm(s.N), rr(s.N);
      naive_layernorm(ro, rm, rr, to_double(xf), to_double(wf), with_bias ? &b : nullptr, s.N, s.C,
                      double(1e-5f));
      EXPECT_LT(rel_error(out, ro), 1e-4) << s.N << "x" << s.C;
      // A float sum of C same-sign terms is within (C - 1) u of the exact one (Higham,
      // Accuracy and Stability, 4.2; u = 2^-24), whatever order the compiler's
      // vectorisation (or its absence) picks.
      EXPECT_LT(rel_error(mean, rm), double(s.C) * 0x1p-24);
      EXPECT_LT(rel_error(rstd, rr), 1e-4);
    }
  }
}

// dinp, dweight, dbias all accumulate: start them from random values and subtract.
TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const int64_t N = 5, C = 7;
  auto x = randn(N * C, 10), w = randn(C, 11), b = randn(C, 12);
  const auto R = randn(N * C, 13);
  std::vector<double> out(N * C), mean(N), rstd(N);
  auto objective = [&] {
    k::layernorm_forward(view(out, {N, C}), view(mean, {N}), view(rstd, {N}), view(x, {N, C}),
                         view(w, {C}), view(b, {C}), 1e-5f);
    return dot(out, R);
  };
  objective();
  const auto dx0 = randn(N * C, 14), dw0 = randn(C, 15), db0 = randn(C, 16);
  auto dx = dx0, dw = dw0, db = db0;
  k::layernorm_backward(view(dx, {N, C}), view(dw, {C}), view(db, {C}), view(R, {N, C}),
                        view(x, {N, C}), view(w, {C}), view(mean, {N}), view(rstd, {N}));
  expect_gradient("inp", x, minus(dx, dx0), objective);
  expect_gradient("weight", w, minus(dw, dw0), objective);
  expect_gradient("bias", b, minus(db, db0), objective);
}

TEST(LayerNorm, BackwardTwiceDoublesAndIsDeterministic) {
  const int64_t N = 301, C = 130;
  const auto x = to_float(randn(N * C, 20)), w = to_float(randn(C, 21));
  const auto dout = to_float(randn(N * C, 22));
  std::vector<float> out(N * C), mean(N), rstd(N);
  k::layernorm_forward(view(out, {N, C}), view(mean, {N}), view(rstd, {N}), view(x, {N, C}),
                       view(w, {C}), Tensor{}, 1e-5f);
  std::vector<float> grads[3][3];  // runs x {dinp, dweight, dbias}
  for (int run = 0; run < 3; ++run) {
    grads[run][0].assign(N * C, 0.0f), grads[run][1].assign(C, 0.0f), grads[run][2].assign(C, 0.0f);
    for (int call = 0; call < (run == 2 ? 2 : 1); ++call)
      k::layernorm_backward(view(grads[run][0], {N, C}), view(grads[run][1], {C}),
                            view(grads[run][2], {C}), view(dout, {N, C}), view(x, {N, C}),
                            view(w, {C}), view(mean, {N}), view(rstd, {N}));
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(bitwise_equal(grads[0][i], grads[1][i])) << i;
    for (size_t j = 0; j < grads[0][i].size(); ++j)
      ASSERT_FLOAT_EQ(grads[2][i][j], 2 * grads[0][i][j]) << i << " " << j;
  }
}

TEST(RmsNorm, ForwardMatchesNaiveInFloat) {
  for (NormShape s : kShapes) {
    const auto x = to_float(randn(s.N * s.C, 1)), w = to_float(randn(s.C, 2));
    std::vector<float> out(s.N * s.C), rstd(s.N);
    k::rmsnorm_forward(view(out, {s.N, s.C}), view(rstd, {s.N}), view(x, {s.N, s.C}),
                       view(w, {s.C}), 1e-6f);
    std::vector<double> ro(s.N * s.C), rr(s.N);
    for (int64_t n = 0; n < s.N; ++n) {
      double ss = 0;
      for (int64_t c = 0; c < s.C; ++c) ss += double(x[n * s.C + c]) * x[n * s.C + c];
      rr[n] = 1 / std::sqrt(ss / s.C + double(1e-6f));
      for (int64_t c = 0; c < s.C; ++c) ro[n * s.C + c] = x[n * s.C + c] * rr[n] * w[c];
    }
    EXPECT_LT(rel_error(out, ro), 1e-5) << s.N << "x" << s.C;
    EXPECT_LT(rel_error(rstd, rr), 1e-5);
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const int64_t N = 5, C = 7;
  auto x = randn(N * C, 10), w = randn(C, 11);
  const auto R = randn(N * C, 13);
  std::vector<double> out(N * C), rstd(N);
  auto objective = [&] {
    k::rmsnorm_forward(view(out, {N, C}), view(rstd, {N}), view(x, {N, C}), view(w, {C}), 1e-6f);
    return dot(out, R);
  };
  objective();
  const auto dx0 = randn(N * C, 14), dw0 = randn(C, 15);
  auto dx = dx0, dw = dw0;
  k::rmsnorm_backward(view(dx, {N, C}), view(dw, {C}), view(R, {N, C}), view(x, {N, C}),
                      view(w, {C}), view(rstd, {N}));
  expect_gradient("inp", x, minus(dx, dx0), objective);
  expect_gradient("weight", w, minus(dw, dw0), objective);
}

TEST(RmsNorm, BackwardTwiceDoublesAndIsDeterministic) {
  const int64_t N = 301, C = 130;
  const auto x = to_float(randn(N * C, 20)), w = to_float(randn(C, 21));
  const auto dout = to_float(randn(N * C, 22));
  std::vector<float> out(N * C), rstd(N);
  k::rmsnorm_forward(view(out, {N, C}), view(rstd, {N}), view(x, {N, C}), view(w, {C}), 1e-6f);
  std::vector<float> grads[3][2];
  for (int run = 0; run < 3; ++run) {
    grads[run][0].assign(N * C, 0.0f), grads[run][1].assign(C, 0.0f);
    for (int call = 0; call < (run == 2 ? 2 : 1); ++call)
      k::rmsnorm_backward(view(grads[run][0], {N, C}), view(grads[run][1], {C}), view(dout, {N, C}),
                          view(x, {N, C}), view(w, {C}), view(rstd, {N}));
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(bitwise_equal(grads[0][i], grads[1][i])) << i;
    for (size_t j = 0; j < grads[0][i].size(); ++j)
      ASSERT_FLOAT_EQ(grads[2][i][j], 2 * grads[0][i][j]) << i << " " << j;
  }
}

}  // namespace
}  // namespace pentad
