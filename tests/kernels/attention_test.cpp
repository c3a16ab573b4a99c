#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace pentad {
namespace {

using namespace testing;
namespace k = kernels;

struct AttnShape {
  int64_t B, T, Hq, Hkv, D;
  Shape q() const { return {B, T, Hq, D}; }
  Shape kv() const { return {B, T, Hkv, D}; }
  Shape lse() const { return {B, Hq, T}; }
  int64_t q_numel() const { return B * T * Hq * D; }
  int64_t kv_numel() const { return B * T * Hkv * D; }
};

// Materialises every (T, T) score matrix, in double: out (B, T, Hq, D), lse (B, Hq, T).
void naive_attention(std::vector<double>& out, std::vector<double>& lse,
                     const std::vector<double>& q, const std::vector<double>& k,
                     const std::vector<double>& v, AttnShape s) {
  const int64_t group = s.Hq / s.Hkv;
  std::vector<double> scores(s.T * s.T);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h) {
      const int64_t hk = h / group;
      auto qi = [&](int64_t t, int64_t c) { return q[((b * s.T + t) * s.Hq + h) * s.D + c]; };
      auto kj = [&](int64_t t, int64_t c) { return k[((b * s.T + t) * s.Hkv + hk) * s.D + c]; };
      auto vj = [&](int64_t t, int64_t c) { return v[((b * s.T + t) * s.Hkv + hk) * s.D + c]; };
      for (int64_t i = 0; i < s.T; ++i) {
        double max = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t c = 0; c < s.D; ++c) d += qi(i, c) * kj(j, c);
          scores[i * s.T + j] = d / std::sqrt(double(s.D));
          max = std::max(max, scores[i * s.T + j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(scores[i * s.T + j] - max);
        lse[(b * s.Hq + h) * s.T + i] = max + std::log(sum);
        for (int64_t c = 0; c < s.D; ++c) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j)
            o += std::exp(scores[i * s.T + j] - max) / sum * vj(j, c);
          out[((b * s.T + i) * s.Hq + h) * s.D + c] = o;
        }
      }
    }
}

// T crosses the 64-row block at 65, 70 and 150; Hq/Hkv covers GQA, MQA and plain MHA.
const AttnShape kForwardShapes[] = {{2, 9, 4, 2, 8},  {1, 1, 2, 2, 4},   {2, 64, 4, 4, 16},
                                    {1, 65, 4, 1, 8}, {2, 70, 6, 3, 32}, {1, 150, 2, 1, 64}};

TEST(Attention, ForwardMatchesNaiveInFloat) {
  for (AttnShape s : kForwardShapes) {
    const auto q = to_float(randn(s.q_numel(), 1)), kk = to_float(randn(s.kv_numel(), 2)),
               v = to_float(randn(s.kv_numel(), 3));
    std::vector<float> out(s.q_numel(), NAN), lse(s.B * s.Hq * s.T, NAN);
    k::attention_forward(view(out, s.q()), view(lse, s.lse()), view(q, s.q()), view(kk, s.kv()),
                         view(v, s.kv()));
    std::vector<double> ref_out(out.size()), ref_lse(lse.size());
    naive_attention(ref_out, ref_lse, to_double(q), to_double(kk), to_double(v), s);
    EXPECT_LT(rel_error(out, ref_out), 1e-5) << "T " << s.T << " Hq " << s.Hq << " Hkv " << s.Hkv;
    EXPECT_LT(rel_error(lse, ref_lse), 1e-5) << "T " << s.T;
  }
}

// First row attends only to itself: out[:, 0, h] = v[:, 0, h / group] exactly.
TEST(Attention, FirstTokenCopiesItsValue) {
  const AttnShape s{1, 3, 4, 2, 8};
  const auto q = to_float(randn(s.q_numel(), 4)), kk = to_float(randn(s.kv_numel(), 5)),
             v = to_float(randn(s.kv_numel(), 6));
  std::vector<float> out(s.q_numel());
  k::attention_forward(view(out, s.q()), Tensor{}, view(q, s.q()), view(kk, s.kv()),
                       view(v, s.kv()));
  for (int64_t h = 0; h < s.Hq; ++h)
    for (int64_t c = 0; c < s.D; ++c) EXPECT_FLOAT_EQ(out[h * s.D + c], v[(h / 2) * s.D + c]);
}

// dq, dk, dv are overwritten: they start as garbage.
void check_backward(AttnShape s) {
  auto q = randn(s.q_numel(), 10), kk = randn(s.kv_numel(), 11), v = randn(s.kv_numel(), 12);
  const auto R = randn(s.q_numel(), 13);
  std::vector<double> out(s.q_numel()), lse(s.B * s.Hq * s.T);
  auto objective = [&] {
    k::attention_forward(view(out, s.q()), view(lse, s.lse()), view(q, s.q()), view(kk, s.kv()),
                         view(v, s.kv()));
    return dot(out, R);
  };
  objective();
  std::vector<double> dq(q.size(), 1e30), dk(kk.size(), 1e30), dv(v.size(), 1e30);
  k::attention_backward(view(dq, s.q()), view(dk, s.kv()), view(dv, s.kv()), view(R, s.q()),
                        view(q, s.q()), view(kk, s.kv()), view(v, s.kv()), view(out, s.q()),
                        view(lse, s.lse()));
  expect_gradient("q", q, dq, objective, 300);
  expect_gradient("k", kk, dk, objective, 300);
  expect_gradient("v", v, dv, objective, 300);
}

TEST(Attention, BackwardMatchesFiniteDifferencesGqa) {
  check_backward({2, 9, 4, 2, 8});
}
TEST(Attention, BackwardMatchesFiniteDifferencesGqaAcrossBlocks) {
  check_backward({2, 70, 4, 2, 8});
}
TEST(Attention, BackwardMatchesFiniteDifferencesMha) {
  check_backward({2, 9, 3, 3, 8});
}
TEST(Attention, BackwardMatchesFiniteDifferencesMhaAcrossBlocks) {
  check_backward({1, 70, 2, 2, 6});
}
// One (b, kv head) task: fewer tasks than threads takes the BLAS-threaded path.
TEST(Attention, BackwardMatchesFiniteDifferencesSingleKvHead) {
  check_backward({1, 130, 2, 1, 4});
}

TEST(Attention, BackwardIsDeterministic) {
  const AttnShape s{2, 150, 4, 2, 32};
  const auto q = to_float(randn(s.q_numel(), 20)), kk = to_float(randn(s.kv_numel(), 21)),
             v = to_float(randn(s.kv_numel(), 22)), dout = to_float(randn(s.q_numel(), 23));
  std::vector<float> out(s.q_numel()), lse(s.B * s.Hq * s.T);
  k::attention_forward(view(out, s.q()), view(lse, s.lse()), view(q, s.q()), view(kk, s.kv()),
                       view(v, s.kv()));
  std::vector<float> grads[2][3];
  for (auto& g : grads) {
    g[0].assign(q.size(), 0.0f), g[1].assign(kk.size(), 0.0f), g[2].assign(v.size(), 0.0f);
    k::attention_backward(view(g[0], s.q()), view(g[1], s.kv()), view(g[2], s.kv()),
                          view(dout, s.q()), view(q, s.q()), view(kk, s.kv()), view(v, s.kv()),
                          view(out, s.q()), view(lse, s.lse()));
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(bitwise_equal(grads[0][i], grads[1][i])) << i;
}

TEST(Attention, HeadsNotAMultipleOfKvHeadsAreRejected) {
  const AttnShape s{1, 4, 3, 2, 4};
  std::vector<float> q(s.q_numel()), kv(s.kv_numel()), out(s.q_numel());
  EXPECT_THROW(k::attention_forward(view(out, s.q()), Tensor{}, view(q, s.q()), view(kv, s.kv()),
                                    view(kv, s.kv())),
               std::exception);
}

}  // namespace
}  // namespace pentad
