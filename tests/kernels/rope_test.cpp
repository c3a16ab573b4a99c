#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace pentad {
namespace {

using namespace testing;
namespace k = kernels;

// Hugging Face LLaMA's apply_rotary_pos_emb, written out: pairs (i, i + D/2).
std::vector<double> naive_rope(const std::vector<double>& x, int64_t B, int64_t T, int64_t H,
                               int64_t D, int64_t offset, double theta) {
  std::vector<double> y(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < D / 2; ++i) {
          const double angle = double(offset + t) / std::pow(theta, double(2 * i) / double(D));
          const size_t base = static_cast<size_t>(((b * T + t) * H + h) * D);
          const double x1 = x[base + i], x2 = x[base + i + D / 2];
          y[base + i] = x1 * std::cos(angle) - x2 * std::sin(angle);
          y[base + i + D / 2] = x2 * std::cos(angle) + x1 * std::sin(angle);
        }
  return y;
}

struct RopeCase {
  int64_t B, T, H, D, offset;
  float theta;
};

TEST(Rope, ForwardMatchesNaiveInFloat) {
  for (RopeCase c : {RopeCase{2, 9, 3, 8, 0, 10000.0f},
                     {1, 70, 2, 64, 5, 10000.0f},
                     {2, 5, 4, 16, 1000, 500000.0f},
                     {1, 1, 1, 2, 0, 10000.0f}}) {
    const auto x = to_float(randn(c.B * c.T * c.H * c.D, 1));
    auto y = x;
    k::rope_forward(view(y, {c.B, c.T, c.H, c.D}), c.offset, c.theta);
    const auto ref = naive_rope(to_double(x), c.B, c.T, c.H, c.D, c.offset, c.theta);
    EXPECT_LT(rel_error(y, ref), 2e-6) << c.T << " " << c.D << " offset " << c.offset;
  }
}

// L = sum(rope(x) * R): backward (the inverse rotation, in place) of R is dL/dx.
TEST(Rope, BackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 5, H = 3, D = 6, offset = 3;
  auto x = randn(B * T * H * D, 2);
  const auto R = randn(x.size(), 3);
  std::vector<double> y;
  auto objective = [&] {
    y = x;
    k::rope_forward(view(y, {B, T, H, D}), offset, 10000.0f);
    return dot(y, R);
  };
  auto dx = R;
  k::rope_backward(view(dx, {B, T, H, D}), offset, 10000.0f);
  expect_gradient("x", x, dx, objective);
}

TEST(Rope, OddHeadDimIsRejected) {
  std::vector<float> x(1 * 2 * 1 * 5);
  EXPECT_THROW(k::rope_forward(view(x, {1, 2, 1, 5}), 0, 10000.0f), std::exception);
}

}  // namespace
}  // namespace pentad
