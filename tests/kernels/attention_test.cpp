// Causal attention (kernels/ops.h) against a naive reference in double and finite
// differences; explicit positions 0..t-1 against none; zig-zag blocks merged by log-sum-exp
// against full attention. Attention between rows at arbitrary positions is in
// attention_positions_test.cpp.
#include <limits>

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

// Positions 0..t-1 given explicitly run the same arithmetic as none: the same bits.
TEST(Attention, ExplicitPositionsGiveTheBitsOfAbsentOnes) {
  const AttnShape s{2, 150, 4, 2, 16};
  std::vector<int32_t> pos(s.T);
  for (int64_t t = 0; t < s.T; ++t) pos[t] = static_cast<int32_t>(t);
  const auto q = to_float(randn(s.q_numel(), 60)), kk = to_float(randn(s.kv_numel(), 61)),
             v = to_float(randn(s.kv_numel(), 62)), dout = to_float(randn(s.q_numel(), 63));
  std::vector<float> out[2], lse[2], grads[2][3];
  for (int with_pos = 0; with_pos < 2; ++with_pos) {
    const Tensor p = with_pos ? view(pos, {s.T}) : Tensor{};
    out[with_pos].assign(q.size(), 0.0f), lse[with_pos].assign(s.B * s.Hq * s.T, 0.0f);
    k::attention_forward(view(out[with_pos], s.q()), view(lse[with_pos], s.lse()), view(q, s.q()),
                         view(kk, s.kv()), view(v, s.kv()), p, p);
    auto& g = grads[with_pos];
    g[0].assign(q.size(), 0.0f), g[1].assign(kk.size(), 0.0f), g[2].assign(v.size(), 0.0f);
    k::attention_backward(view(g[0], s.q()), view(g[1], s.kv()), view(g[2], s.kv()),
                          view(dout, s.q()), view(q, s.q()), view(kk, s.kv()), view(v, s.kv()),
                          view(out[with_pos], s.q()), view(lse[with_pos], s.lse()), p, p);
  }
  EXPECT_TRUE(bitwise_equal(out[0], out[1]));
  EXPECT_TRUE(bitwise_equal(lse[0], lse[1]));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(bitwise_equal(grads[0][i], grads[1][i])) << i;
}

// Rows `pos` of x (B, T, W) into (B, pos.size(), W).
template <typename T>
std::vector<T> gather_rows(const std::vector<T>& x, int64_t B, int64_t T_, int64_t W,
                           const std::vector<int32_t>& pos) {
  const int64_t n = static_cast<int64_t>(pos.size());
  std::vector<T> y(B * n * W);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i) std::copy_n(&x[(b * T_ + pos[i]) * W], W, &y[(b * n + i) * W]);
  return y;
}

// lse (B, H, T) rows `pos` into (B, H, pos.size()).
template <typename T>
std::vector<T> gather_lse(const std::vector<T>& lse, int64_t B, int64_t H, int64_t T_,
                          const std::vector<int32_t>& pos) {
  const int64_t n = static_cast<int64_t>(pos.size());
  std::vector<T> y(B * H * n);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < n; ++i) y[bh * n + i] = lse[bh * T_ + pos[i]];
  return y;
}

// Zig-zag context parallelism: of 2R chunks of the sequence, rank r holds r and 2R-1-r.
std::vector<int32_t> zigzag_positions(int64_t T_, int64_t R, int64_t r) {
  const int64_t chunk = T_ / (2 * R);
  std::vector<int32_t> pos;
  for (int64_t c : {r, 2 * R - 1 - r})
    for (int64_t t = c * chunk; t < (c + 1) * chunk; ++t) pos.push_back(static_cast<int32_t>(t));
  return pos;
}

// Every rank attends its queries to every rank's K/V block and merges the partial results;
// the merged out/lse must be the full causal attention's rows, and the blocks' backward
// passes, summed with accumulate, the full backward's gradients at those rows.
template <typename T>
void check_zigzag(int64_t R, AttnShape s, double fwd_tol, double bwd_tol) {
  const int64_t Wq = s.Hq * s.D, Wk = s.Hkv * s.D;
  const auto cast = [](const std::vector<double>& x) { return std::vector<T>(x.begin(), x.end()); };
  const auto q = cast(randn(s.q_numel(), 70)), kk = cast(randn(s.kv_numel(), 71)),
             v = cast(randn(s.kv_numel(), 72)), dout = cast(randn(s.q_numel(), 73));
  std::vector<T> out(q.size()), lse(s.B * s.Hq * s.T), dq(q.size()), dk(kk.size()), dv(v.size());
  k::attention_forward(view(out, s.q()), view(lse, s.lse()), view(q, s.q()), view(kk, s.kv()),
                       view(v, s.kv()));
  k::attention_backward(view(dq, s.q()), view(dk, s.kv()), view(dv, s.kv()), view(dout, s.q()),
                        view(q, s.q()), view(kk, s.kv()), view(v, s.kv()), view(out, s.q()),
                        view(lse, s.lse()));

  std::vector<std::vector<int32_t>> pos(R);
  std::vector<std::vector<T>> q_r(R), k_r(R), v_r(R), dout_r(R), out_r(R), lse_r(R);
  for (int64_t r = 0; r < R; ++r) {
    pos[r] = zigzag_positions(s.T, R, r);
    q_r[r] = gather_rows(q, s.B, s.T, Wq, pos[r]);
    k_r[r] = gather_rows(kk, s.B, s.T, Wk, pos[r]);
    v_r[r] = gather_rows(v, s.B, s.T, Wk, pos[r]);
    dout_r[r] = gather_rows(dout, s.B, s.T, Wq, pos[r]);
  }
  const int64_t n = static_cast<int64_t>(pos[0].size());
  const Shape sq{s.B, n, s.Hq, s.D}, skv{s.B, n, s.Hkv, s.D}, sl{s.B, s.Hq, n};
  for (int64_t r = 0; r < R; ++r) {
    out_r[r].assign(q_r[r].size(), T(0));
    lse_r[r].assign(s.B * s.Hq * n, -std::numeric_limits<T>::infinity());
    for (int64_t src = 0; src < R; ++src) {
      std::vector<T> block_out(out_r[r].size(), T(NAN)), block_lse(lse_r[r].size(), T(NAN));
      k::attention_forward(view(block_out, sq), view(block_lse, sl), view(q_r[r], sq),
                           view(k_r[src], skv), view(v_r[src], skv), view(pos[r], {n}),
                           view(pos[src], {n}));
      k::attention_merge(view(out_r[r], sq), view(lse_r[r], sl), view(block_out, sq),
                         view(block_lse, sl));
    }
    EXPECT_LT(rel_error(out_r[r], gather_rows(out, s.B, s.T, Wq, pos[r])), fwd_tol) << "rank " << r;
    EXPECT_LT(rel_error(lse_r[r], gather_lse(lse, s.B, s.Hq, s.T, pos[r])), fwd_tol)
        << "rank " << r;
  }
  std::vector<std::vector<T>> dq_r(R), dk_r(R), dv_r(R);
  for (int64_t r = 0; r < R; ++r)
    dq_r[r].assign(q_r[r].size(), T(0)), dk_r[r].assign(k_r[r].size(), T(0)),
        dv_r[r].assign(v_r[r].size(), T(0));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t src = 0; src < R; ++src)
      k::attention_backward(view(dq_r[r], sq), view(dk_r[src], skv), view(dv_r[src], skv),
                            view(dout_r[r], sq), view(q_r[r], sq), view(k_r[src], skv),
                            view(v_r[src], skv), view(out_r[r], sq), view(lse_r[r], sl),
                            view(pos[r], {n}), view(pos[src], {n}), /*accumulate=*/true);
  for (int64_t r = 0; r < R; ++r) {
    EXPECT_LT(rel_error(dq_r[r], gather_rows(dq, s.B, s.T, Wq, pos[r])), bwd_tol) << "rank " << r;
    EXPECT_LT(rel_error(dk_r[r], gather_rows(dk, s.B, s.T, Wk, pos[r])), bwd_tol) << "rank " << r;
    EXPECT_LT(rel_error(dv_r[r], gather_rows(dv, s.B, s.T, Wk, pos[r])), bwd_tol) << "rank " << r;
  }
}

TEST(Attention, ZigZagBlocksMergeToFullAttentionTwoRanks) {
  check_zigzag<float>(2, {2, 200, 4, 2, 16}, 1e-5, 1e-5);
  check_zigzag<double>(2, {2, 200, 4, 2, 16}, 1e-12, 1e-12);
}
TEST(Attention, ZigZagBlocksMergeToFullAttentionFourRanks) {
  check_zigzag<float>(4, {1, 264, 4, 1, 8}, 1e-5, 1e-5);
  check_zigzag<double>(4, {2, 136, 4, 4, 8}, 1e-12, 1e-12);
}

TEST(Attention, MergeMatchesLogSumExpAndHandlesEmptyRows) {
  const int64_t B = 2, T = 3, H = 2, D = 4;
  auto out = randn(B * T * H * D, 80), block = randn(out.size(), 81);
  auto lse = randn(B * H * T, 82), block_lse = randn(lse.size(), 83);
  const double inf = INFINITY;
  // (b=0, h=0): t=0 seen by neither, t=1 only by the block, t=2 only so far.
  lse[0] = -inf, block_lse[0] = -inf;
  lse[1] = -inf;
  block_lse[2] = -inf;
  for (int64_t c = 0; c < D; ++c) out[0 * H * D + c] = 0;  // a row nothing saw holds 0
  const auto out0 = out, lse0 = lse;
  k::attention_merge(view(out, {B, T, H, D}), view(lse, {B, H, T}), view(block, {B, T, H, D}),
                     view(block_lse, {B, H, T}));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t l = (b * H + h) * T + t, o = ((b * T + t) * H + h) * D;
        const double want = std::log(std::exp(lse0[l]) + std::exp(block_lse[l]));
        if (want == -inf)
          EXPECT_EQ(lse[l], -inf) << l;
        else
          EXPECT_NEAR(lse[l], want, 1e-14) << l;
        for (int64_t c = 0; c < D; ++c) {
          const double ref = want == -inf ? 0.0
                                          : out0[o + c] * std::exp(lse0[l] - want) +
                                                block[o + c] * std::exp(block_lse[l] - want);
          EXPECT_NEAR(out[o + c], ref, 1e-14) << l;
        }
      }
}

}  // namespace
}  // namespace pentad
