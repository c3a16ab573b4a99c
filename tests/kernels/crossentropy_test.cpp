#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace pentad {
namespace {

using namespace testing;
namespace k = kernels;

// Large logits (std 30, offset 500) would overflow a softmax without the max subtraction.
TEST(CrossEntropy, ForwardAndGradientMatchNaiveInFloat) {
  for (auto [N, V] : {std::pair<int64_t, int64_t>{5, 7}, {33, 1000}, {4, 50257}}) {
    auto x = randn(N * V, 1, 30.0);
    for (double& v : x) v += 500.0;
    const auto logits = to_float(x);
    const auto targets = random_ids(N, V, 2);
    const float dloss = 0.25f;
    std::vector<float> losses(N), dlogits(N * V);
    k::crossentropy_forward_backward(view(losses, {N}), view(dlogits, {N, V}), view(logits, {N, V}),
                                     view(targets, {N}), dloss);
    std::vector<double> ref_losses(N), ref_d(N * V);
    for (int64_t n = 0; n < N; ++n) {
      double max = -INFINITY, sum = 0;
      for (int64_t j = 0; j < V; ++j) max = std::max(max, double(logits[n * V + j]));
      for (int64_t j = 0; j < V; ++j) sum += std::exp(logits[n * V + j] - max);
      ref_losses[n] = max + std::log(sum) - logits[n * V + targets[n]];
      for (int64_t j = 0; j < V; ++j)
        ref_d[n * V + j] = (std::exp(logits[n * V + j] - max) / sum - (j == targets[n])) * dloss;
    }
    for (int64_t n = 0; n < N; ++n) ASSERT_TRUE(std::isfinite(losses[n]));
    EXPECT_LT(rel_error(losses, ref_losses), 1e-4) << N << "x" << V;
    EXPECT_LT(rel_error(dlogits, ref_d), 1e-5) << N << "x" << V;
  }
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  const int64_t N = 5, V = 7;
  auto logits = randn(N * V, 3, 2.0);
  const auto targets = random_ids(N, V, 4);
  const float dloss = 0.5f;
  std::vector<double> losses(N);
  auto objective = [&] {
    k::crossentropy_forward_backward(view(losses, {N}), Tensor{}, view(logits, {N, V}),
                                     view(targets, {N}), dloss);
    double sum = 0;
    for (double l : losses) sum += l;
    return dloss * sum;
  };
  std::vector<double> dlogits(N * V, 1e30);
  k::crossentropy_forward_backward(Tensor{}, view(dlogits, {N, V}), view(logits, {N, V}),
                                   view(targets, {N}), dloss);
  expect_gradient("logits", logits, dlogits, objective);
}

TEST(CrossEntropy, DlogitsMayAliasLogits) {
  const int64_t N = 6, V = 300;
  const auto logits = to_float(randn(N * V, 5, 3.0));
  const auto targets = random_ids(N, V, 6);
  std::vector<float> losses(N), dlogits(N * V), aliased_losses(N);
  auto aliased = logits;
  k::crossentropy_forward_backward(view(losses, {N}), view(dlogits, {N, V}), view(logits, {N, V}),
                                   view(targets, {N}), 1.0f);
  k::crossentropy_forward_backward(view(aliased_losses, {N}), view(aliased, {N, V}),
                                   view(aliased, {N, V}), view(targets, {N}), 1.0f);
  EXPECT_TRUE(bitwise_equal(losses, aliased_losses));
  EXPECT_TRUE(bitwise_equal(dlogits, aliased));
}

TEST(CrossEntropy, TargetsOutOfRangeAreRejected) {
  const int64_t N = 2, V = 4;
  std::vector<float> logits(N * V), losses(N);
  for (int32_t bad : {-1, 4}) {
    const std::vector<int32_t> targets = {0, bad};
    EXPECT_THROW(k::crossentropy_forward_backward(view(losses, {N}), Tensor{}, view(logits, {N, V}),
                                                  view(targets, {N}), 1.0f),
                 std::exception)
        << bad;
  }
}

}  // namespace
}  // namespace pentad
