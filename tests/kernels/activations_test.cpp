#include "kernel_test_util.h"
#include "kernels/cpu/common.h"
#include "kernels/ops.h"

namespace pentad {
namespace {

using namespace testing;
namespace k = kernels;

double naive_gelu(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
double naive_silu(double x) {
  return x / (1 + std::exp(-x));
}

// Values across the interesting range, including saturation on both sides.
std::vector<double> test_inputs(size_t n, uint64_t seed) {
  auto x = randn(n, seed, 3.0);
  x[0] = 0.0, x[1] = -30.0, x[2] = 30.0, x[3] = -100.0, x[4] = 1e-4;
  return x;
}

// The float kernels (softmax, cross-entropy, GELU, SwiGLU) lean on these approximations.
TEST(FastMath, ExpAndTanhAreWithinAFewUlp) {
  double worst_exp = 0, worst_tanh = 0;
  for (float x = -87.0f; x < 88.0f; x += 0.0137f) {
    const double ref = std::exp(double(x));
    worst_exp = std::max(worst_exp, std::abs(kernels::cpu::exp_vec(x) - ref) / ref);
  }
  for (float x = -12.0f; x < 12.0f; x += 0.00137f)
    worst_tanh = std::max(worst_tanh, std::abs(kernels::cpu::tanh_vec(x) - std::tanh(double(x))));
  EXPECT_LT(worst_exp, 2.5e-7);  // 2 ulp
  EXPECT_LT(worst_tanh, 2.5e-7);
  EXPECT_EQ(kernels::cpu::tanh_vec(30.0f), 1.0f);
  EXPECT_EQ(kernels::cpu::tanh_vec(-30.0f), -1.0f);
}

TEST(Gelu, ForwardMatchesNaiveInFloat) {
  for (int64_t n : {5, 1000, 70001}) {
    const auto x = to_float(test_inputs(n, 1));
    std::vector<float> out(n);
    k::gelu_forward(view(out, {n}), view(x, {n}));
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(out[i], naive_gelu(x[i]), 1e-6 * (1 + std::abs(x[i]))) << "x = " << x[i];
  }
}

// dinp is overwritten: it starts as garbage.
TEST(Gelu, BackwardMatchesFiniteDifferences) {
  const int64_t n = 35;
  auto x = test_inputs(n, 2);
  const auto R = randn(n, 3);
  std::vector<double> out(n), dx(n, 1e30);
  auto objective = [&] {
    k::gelu_forward(view(out, {5, 7}), view(x, {5, 7}));
    return dot(out, R);
  };
  k::gelu_backward(view(dx, {5, 7}), view(R, {5, 7}), view(x, {5, 7}));
  expect_gradient("inp", x, dx, objective);
}

TEST(SwiGlu, ForwardMatchesNaiveInFloat) {
  for (int64_t n : {5, 1000, 70001}) {
    const auto g = to_float(test_inputs(n, 1)), u = to_float(randn(n, 2));
    std::vector<float> out(n);
    k::swiglu_forward(view(out, {n}), view(g, {n}), view(u, {n}));
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(out[i], naive_silu(g[i]) * u[i], 1e-6 * (1 + std::abs(g[i] * u[i])))
          << "gate " << g[i];
  }
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  const int64_t N = 5, F = 7;
  auto g = test_inputs(N * F, 4), u = randn(N * F, 5);
  const auto R = randn(N * F, 6);
  std::vector<double> out(N * F), dg(N * F, 1e30), du(N * F, 1e30);
  auto objective = [&] {
    k::swiglu_forward(view(out, {N, F}), view(g, {N, F}), view(u, {N, F}));
    return dot(out, R);
  };
  k::swiglu_backward(view(dg, {N, F}), view(du, {N, F}), view(R, {N, F}), view(g, {N, F}),
                     view(u, {N, F}));
  expect_gradient("gate", g, dg, objective);
  expect_gradient("up", u, du, objective);
}

// A split backward (zero-bubble pipelines) writes each activation's gradient over the
// pre-activation it reads: in place, the values are bitwise the out-of-place ones, at sizes
// that take the vector and threaded paths.
TEST(Activations, BackwardInPlaceEqualsOutOfPlace) {
  for (int64_t n : {35, 70001}) {
    const auto x = to_float(test_inputs(n, 7)), u = to_float(randn(n, 8)),
               R = to_float(randn(n, 9));
    std::vector<float> dx(n);
    k::gelu_backward(view(dx, {n}), view(R, {n}), view(x, {n}));
    auto x_in_place = x;
    k::gelu_backward(view(x_in_place, {n}), view(R, {n}), view(x_in_place, {n}));
    EXPECT_EQ(x_in_place, dx) << "gelu, n " << n;

    std::vector<float> dg(n), du(n);
    k::swiglu_backward(view(dg, {n}), view(du, {n}), view(R, {n}), view(x, {n}), view(u, {n}));
    auto g_in_place = x, u_in_place = u;
    k::swiglu_backward(view(g_in_place, {n}), view(u_in_place, {n}), view(R, {n}),
                       view(g_in_place, {n}), view(u_in_place, {n}));
    EXPECT_EQ(g_in_place, dg) << "swiglu d(gate), n " << n;
    EXPECT_EQ(u_in_place, du) << "swiglu d(up), n " << n;
  }
}

}  // namespace
}  // namespace pentad
