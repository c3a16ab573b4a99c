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

// Positions pos_offset..pos_offset+t-1 given explicitly rotate as pos_offset does.
TEST(Rope, PositionsEqualToAnOffsetMatchTheOffset) {
  const int64_t B = 2, T = 7, H = 3, D = 8, offset = 11;
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(offset + t);
  const auto x = to_float(randn(B * T * H * D, 4));
  for (bool inverse : {false, true}) {
    auto by_offset = x, by_pos = x;
    auto apply = inverse ? k::rope_backward : k::rope_forward;
    apply(view(by_offset, {B, T, H, D}), offset, 10000.0f, Tensor{});
    apply(view(by_pos, {B, T, H, D}), 0, 10000.0f, view(pos, {T}));
    EXPECT_TRUE(bitwise_equal(by_offset, by_pos)) << "inverse " << inverse;
  }
}

// A rank holding zig-zag chunks (r and 2R-1-r of 2R) rotates its rows as the whole sequence
// rotates them at those positions.
TEST(Rope, ZigZagPositionsMatchTheFullSequenceRows) {
  const int64_t B = 2, T = 48, H = 2, D = 16, R = 4, chunk = T / (2 * R);
  const auto x = to_float(randn(B * T * H * D, 5));
  auto full = x;
  k::rope_forward(view(full, {B, T, H, D}), 0, 10000.0f);
  for (int64_t r = 0; r < R; ++r) {
    std::vector<int32_t> pos;
    for (int64_t c : {r, 2 * R - 1 - r})
      for (int64_t t = c * chunk; t < (c + 1) * chunk; ++t) pos.push_back(static_cast<int32_t>(t));
    const int64_t n = static_cast<int64_t>(pos.size()), W = H * D;
    std::vector<float> mine(B * n * W), want(mine.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n; ++i) {
        std::copy_n(&x[(b * T + pos[i]) * W], W, &mine[(b * n + i) * W]);
        std::copy_n(&full[(b * T + pos[i]) * W], W, &want[(b * n + i) * W]);
      }
    k::rope_forward(view(mine, {B, n, H, D}), 0, 10000.0f, view(pos, {n}));
    EXPECT_TRUE(bitwise_equal(mine, want)) << "rank " << r;
    k::rope_backward(view(mine, {B, n, H, D}), 0, 10000.0f, view(pos, {n}));
    std::vector<float> original(mine.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(&x[(b * T + pos[i]) * W], W, &original[(b * n + i) * W]);
    EXPECT_LT(rel_error(mine, original), 1e-6) << "rank " << r << ": backward inverts forward";
  }
}

TEST(Rope, PositionsWithAnOffsetAreRejected) {
  std::vector<float> x(1 * 2 * 1 * 4);
  const std::vector<int32_t> pos{3, 4};
  EXPECT_THROW(k::rope_forward(view(x, {1, 2, 1, 4}), 1, 10000.0f, view(pos, {2})), std::exception);
}

}  // namespace
}  // namespace pentad
