// The fused entry points (residual + norm, linear + GELU, the backward through GELU) and the
// dtype conversion, on the CPU: each equals the unfused ops it stands for, and the backward
// through GELU matches finite differences. The CUDA versions are checked against these in
// tests/cuda/.
#include "core/bf16.h"
#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace pentad {
namespace {

using namespace testing;
namespace k = kernels;

TEST(Fused, ResidualNormsEqualAddThenNorm) {
  const int64_t N = 9, C = 37;
  const auto a = to_float(randn(N * C, 1)), b = to_float(randn(N * C, 2));
  const auto w = to_float(randn(C, 3)), bias = to_float(randn(C, 4));
  for (bool rms : {false, true}) {
    std::vector<float> sum(N * C), out(N * C), mean(N), rstd(N);
    k::add(view(sum, {N, C}), view(a, {N, C}), view(b, {N, C}));
    if (rms)
      k::rmsnorm_forward(view(out, {N, C}), view(rstd, {N}), view(sum, {N, C}), view(w, {C}),
                         1e-5f);
    else
      k::layernorm_forward(view(out, {N, C}), view(mean, {N}), view(rstd, {N}), view(sum, {N, C}),
                           view(w, {C}), view(bias, {C}), 1e-5f);
    // The residual written over its first input, as a residual stream does.
    std::vector<float> residual = a, fused(N * C), fused_mean(N), fused_rstd(N);
    if (rms)
      k::residual_rmsnorm_forward(view(residual, {N, C}), view(fused, {N, C}),
                                  view(fused_rstd, {N}), view(residual, {N, C}), view(b, {N, C}),
                                  view(w, {C}), 1e-5f);
    else
      k::residual_layernorm_forward(
          view(residual, {N, C}), view(fused, {N, C}), view(fused_mean, {N}), view(fused_rstd, {N}),
          view(residual, {N, C}), view(b, {N, C}), view(w, {C}), view(bias, {C}), 1e-5f);
    EXPECT_TRUE(bitwise_equal(residual, sum)) << rms;
    EXPECT_TRUE(bitwise_equal(fused, out)) << rms;
    EXPECT_TRUE(bitwise_equal(fused_rstd, rstd)) << rms;
    if (!rms) {
      EXPECT_TRUE(bitwise_equal(fused_mean, mean));
    }
  }
}

TEST(Fused, LinearGeluEqualsLinearThenGelu) {
  const int64_t N = 7, C = 13, OC = 10;
  const auto x = to_float(randn(N * C, 5)), w = to_float(randn(OC * C, 6, 0.3));
  const auto b = to_float(randn(OC, 7));
  std::vector<float> pre(N * OC), out(N * OC), fused_pre(N * OC), fused(N * OC);
  k::linear_forward(view(pre, {N, OC}), view(x, {N, C}), view(w, {OC, C}), view(b, {OC}));
  k::gelu_forward(view(out, {N, OC}), view(pre, {N, OC}));
  k::linear_gelu_forward(view(fused, {N, OC}), view(fused_pre, {N, OC}), view(x, {N, C}),
                         view(w, {OC, C}), view(b, {OC}));
  EXPECT_TRUE(bitwise_equal(fused_pre, pre));
  EXPECT_TRUE(bitwise_equal(fused, out));
}

// objective(pre) = sum R * (gelu(pre) @ W^T + b): its gradients with respect to pre, W and b.
TEST(Fused, LinearBackwardThroughGeluMatchesFiniteDifferences) {
  const int64_t N = 5, C = 6, OC = 4;
  auto pre = randn(N * C, 8), w = randn(OC * C, 9, 0.5), b = randn(OC, 10);
  const auto R = randn(N * OC, 11);
  std::vector<double> h(N * C), y(N * OC);
  auto objective = [&] {
    k::gelu_forward(view(h, {N, C}), view(pre, {N, C}));
    k::linear_forward(view(y, {N, OC}), view(h, {N, C}), view(w, {OC, C}), view(b, {OC}));
    return dot(y, R);
  };
  objective();
  std::vector<double> dpre(N * C, 1e30), dw(OC * C, 0.0), db(OC, 0.0);
  k::linear_backward_gelu(view(dpre, {N, C}), view(dw, {OC, C}), view(db, {OC}), view(R, {N, OC}),
                          view(h, {N, C}), view(w, {OC, C}), view(pre, {N, C}));
  expect_gradient("pre_gelu", pre, dpre, objective);
  expect_gradient("weight", w, dw, objective);
  expect_gradient("bias", b, db, objective);
}

Tensor bf16_view(std::vector<uint16_t>& bits, Shape shape) {
  return view_of(bits.data(), shape, DType::BF16);
}

TEST(Convert, BetweenF32F64AndBf16) {
  const int64_t n = 1000;
  const auto d = randn(n, 12, 50.0);
  std::vector<float> f(n), back(n);
  k::convert(view(f, {n}), view(d, {n}));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f[i], static_cast<float>(d[i]));
  std::vector<uint16_t> bits(n);
  k::convert(bf16_view(bits, {n}), view(f, {n}));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits[i], float_to_bf16(f[i]));
  k::convert(view(back, {n}), bf16_view(bits, {n}));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(back[i], bf16_to_float(bits[i]));
  std::vector<double> wide(n);
  k::convert(view(wide, {n}), view(f, {n}));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(wide[i], static_cast<double>(f[i]));
  std::vector<int32_t> ints(n);
  EXPECT_THROW(k::convert(view(ints, {n}), view(f, {n})), std::exception);
  std::vector<float> shorter(n - 1);
  EXPECT_THROW(k::convert(view(shorter, {n - 1}), view(d, {n})), std::exception);
}

}  // namespace
}  // namespace pentad
