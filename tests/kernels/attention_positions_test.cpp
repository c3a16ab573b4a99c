// Attention between query rows and key rows at given positions (context parallelism): the
// forward and backward against the reference by definition in double, the backward against
// finite differences, and the position arguments' checks.
#include <algorithm>
#include <cmath>
#include <random>

#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace pentad {
namespace {

using namespace testing;
namespace k = kernels;

// ---- positions (context parallelism) ----

// Attention between query rows at q_pos and key rows at k_pos (B, Tq / Tk rows each).
struct PosShape {
  int64_t B, Tq, Tk, Hq, Hkv, D;
  Shape q() const { return {B, Tq, Hq, D}; }
  Shape kv() const { return {B, Tk, Hkv, D}; }
  Shape lse() const { return {B, Hq, Tq}; }
  int64_t q_numel() const { return B * Tq * Hq * D; }
  int64_t kv_numel() const { return B * Tk * Hkv * D; }
};

// n sorted distinct positions drawn from [first, first + span).
std::vector<int32_t> random_positions(int64_t n, int64_t first, int64_t span, uint64_t seed) {
  std::vector<int32_t> all(static_cast<size_t>(span));
  for (int64_t i = 0; i < span; ++i) all[i] = static_cast<int32_t>(first + i);
  std::mt19937_64 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(n));
  std::sort(all.begin(), all.end());
  return all;
}

// The reference by definition, in double: query i sees key j iff k_pos[j] <= q_pos[i];
// out = 0 and lse = -inf for a row that sees none.
void naive_forward(std::vector<double>& out, std::vector<double>& lse, const std::vector<double>& q,
                   const std::vector<double>& k, const std::vector<double>& v,
                   const std::vector<int32_t>& q_pos, const std::vector<int32_t>& k_pos,
                   PosShape s) {
  const int64_t group = s.Hq / s.Hkv;
  const double scale = 1.0 / std::sqrt(double(s.D));
  std::vector<double> p(s.Tk);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.Tq; ++i) {
        const double* qi = &q[((b * s.Tq + i) * s.Hq + h) * s.D];
        double max = -INFINITY;
        for (int64_t j = 0; j < s.Tk; ++j) {
          p[j] = -INFINITY;
          if (k_pos[j] > q_pos[i]) continue;
          const double* kj = &k[((b * s.Tk + j) * s.Hkv + h / group) * s.D];
          double d = 0;
          for (int64_t c = 0; c < s.D; ++c) d += qi[c] * kj[c];
          p[j] = d * scale;
          max = std::max(max, p[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < s.Tk; ++j) sum += p[j] == -INFINITY ? 0.0 : std::exp(p[j] - max);
        lse[(b * s.Hq + h) * s.Tq + i] = sum == 0 ? -INFINITY : max + std::log(sum);
        double* oi = &out[((b * s.Tq + i) * s.Hq + h) * s.D];
        for (int64_t c = 0; c < s.D; ++c) {
          double o = 0;
          for (int64_t j = 0; j < s.Tk; ++j)
            if (p[j] != -INFINITY)
              o += std::exp(p[j] - max) / sum * v[((b * s.Tk + j) * s.Hkv + h / group) * s.D + c];
          oi[c] = o;
        }
      }
}

// The backward by its formulas, in double: P = exp(S - lse), D_i = dout_i . out_i,
// dS = P (dP - D); dq = scale dS K, dk = scale dS^T Q, dv = P^T dout (all overwritten).
void naive_backward(std::vector<double>& dq, std::vector<double>& dk, std::vector<double>& dv,
                    const std::vector<double>& dout, const std::vector<double>& q,
                    const std::vector<double>& k, const std::vector<double>& v,
                    const std::vector<double>& out, const std::vector<double>& lse,
                    const std::vector<int32_t>& q_pos, const std::vector<int32_t>& k_pos,
                    PosShape s) {
  const int64_t group = s.Hq / s.Hkv;
  const double scale = 1.0 / std::sqrt(double(s.D));
  std::fill(dq.begin(), dq.end(), 0.0);
  std::fill(dk.begin(), dk.end(), 0.0);
  std::fill(dv.begin(), dv.end(), 0.0);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.Tq; ++i) {
        const double row_lse = lse[(b * s.Hq + h) * s.Tq + i];
        if (row_lse == -INFINITY) continue;
        const int64_t qo = ((b * s.Tq + i) * s.Hq + h) * s.D;
        double d_i = 0;
        for (int64_t c = 0; c < s.D; ++c) d_i += dout[qo + c] * out[qo + c];
        for (int64_t j = 0; j < s.Tk; ++j) {
          if (k_pos[j] > q_pos[i]) continue;
          const int64_t ko = ((b * s.Tk + j) * s.Hkv + h / group) * s.D;
          double score = 0, dp = 0;
          for (int64_t c = 0; c < s.D; ++c) score += q[qo + c] * k[ko + c];
          for (int64_t c = 0; c < s.D; ++c) dp += dout[qo + c] * v[ko + c];
          const double p = std::exp(score * scale - row_lse), ds = p * (dp - d_i);
          for (int64_t c = 0; c < s.D; ++c) {
            dq[qo + c] += scale * ds * k[ko + c];
            dk[ko + c] += scale * ds * q[qo + c];
            dv[ko + c] += p * dout[qo + c];
          }
        }
      }
}

bool all_finite(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
}

// A shape with its positions: q_first/k_first shift the ranges, so that with k_first >
// q_first the first query rows (a whole 64-row block when the gap is wide) see no key.
struct PosCase {
  PosShape s;
  int64_t q_first, k_first, span;
};
const PosCase kPosCases[] = {
    {{2, 9, 13, 4, 2, 8}, 0, 3, 20},        // tq < tk, rows with no key
    {{1, 70, 40, 4, 1, 16}, 0, 0, 100},     // MQA, tq > tk
    {{2, 130, 150, 4, 2, 8}, 0, 100, 300},  // the first block sees nothing
    {{1, 65, 65, 4, 4, 16}, 5, 0, 80},      // every row sees a key
};

TEST(Attention, PositionsForwardMatchesNaive) {
  for (const PosCase& c : kPosCases) {
    const PosShape s = c.s;
    const auto q_pos = random_positions(s.Tq, c.q_first, c.span, 30);
    const auto k_pos = random_positions(s.Tk, c.k_first, c.span, 31);
    const auto q = randn(s.q_numel(), 32), kk = randn(s.kv_numel(), 33),
               v = randn(s.kv_numel(), 34);
    std::vector<double> ref_out(q.size()), ref_lse(s.B * s.Hq * s.Tq);
    naive_forward(ref_out, ref_lse, q, kk, v, q_pos, k_pos, s);
    std::vector<float> out(q.size(), NAN), lse(ref_lse.size(), NAN);
    k::attention_forward(view(out, s.q()), view(lse, s.lse()), view(to_float(q), s.q()),
                         view(to_float(kk), s.kv()), view(to_float(v), s.kv()), view(q_pos, {s.Tq}),
                         view(k_pos, {s.Tk}));
    EXPECT_LT(rel_error(out, ref_out), 1e-5) << "Tq " << s.Tq << " Tk " << s.Tk;
    std::vector<double> out64(q.size(), NAN), lse64(ref_lse.size(), NAN);
    k::attention_forward(view(out64, s.q()), view(lse64, s.lse()), view(q, s.q()), view(kk, s.kv()),
                         view(v, s.kv()), view(q_pos, {s.Tq}), view(k_pos, {s.Tk}));
    EXPECT_LT(rel_error(out64, ref_out), 1e-12) << "Tq " << s.Tq;
    int64_t empty = 0;
    for (size_t i = 0; i < lse.size(); ++i) {
      if (ref_lse[i] == -INFINITY) {
        ++empty;
        EXPECT_EQ(lse[i], -INFINITY) << i;
        EXPECT_EQ(lse64[i], -INFINITY) << i;
      } else {
        EXPECT_NEAR(lse[i], ref_lse[i], 1e-5 * std::max(1.0, std::abs(ref_lse[i]))) << i;
        EXPECT_NEAR(lse64[i], ref_lse[i], 1e-12 * std::max(1.0, std::abs(ref_lse[i]))) << i;
      }
    }
    if (c.k_first > c.q_first) {
      EXPECT_GT(empty, 0) << "test bug: no row without a key";
    }
  }
}

// Backward of one block against the formulas; in float on top of garbage with accumulate.
TEST(Attention, PositionsBackwardMatchesNaive) {
  for (const PosCase& c : kPosCases) {
    const PosShape s = c.s;
    const auto q_pos = random_positions(s.Tq, c.q_first, c.span, 40);
    const auto k_pos = random_positions(s.Tk, c.k_first, c.span, 41);
    const auto q = randn(s.q_numel(), 42), kk = randn(s.kv_numel(), 43),
               v = randn(s.kv_numel(), 44), dout = randn(s.q_numel(), 45);
    std::vector<double> out(q.size()), lse(s.B * s.Hq * s.Tq);
    naive_forward(out, lse, q, kk, v, q_pos, k_pos, s);
    std::vector<double> ref_dq(q.size()), ref_dk(kk.size()), ref_dv(v.size());
    naive_backward(ref_dq, ref_dk, ref_dv, dout, q, kk, v, out, lse, q_pos, k_pos, s);

    std::vector<double> dq(q.size(), 1e30), dk(kk.size(), 1e30), dv(v.size(), 1e30);
    k::attention_backward(view(dq, s.q()), view(dk, s.kv()), view(dv, s.kv()), view(dout, s.q()),
                          view(q, s.q()), view(kk, s.kv()), view(v, s.kv()), view(out, s.q()),
                          view(lse, s.lse()), view(q_pos, {s.Tq}), view(k_pos, {s.Tk}));
    EXPECT_LT(rel_error(dq, ref_dq), 1e-12) << "Tq " << s.Tq;
    EXPECT_LT(rel_error(dk, ref_dk), 1e-12) << "Tq " << s.Tq;
    EXPECT_LT(rel_error(dv, ref_dv), 1e-12) << "Tq " << s.Tq;

    const auto dq0 = to_float(randn(q.size(), 46)), dk0 = to_float(randn(kk.size(), 47)),
               dv0 = to_float(randn(v.size(), 48));
    auto dq32 = dq0, dk32 = dk0, dv32 = dv0;
    k::attention_backward(view(dq32, s.q()), view(dk32, s.kv()), view(dv32, s.kv()),
                          view(to_float(dout), s.q()), view(to_float(q), s.q()),
                          view(to_float(kk), s.kv()), view(to_float(v), s.kv()),
                          view(to_float(out), s.q()), view(to_float(lse), s.lse()),
                          view(q_pos, {s.Tq}), view(k_pos, {s.Tk}), /*accumulate=*/true);
    ASSERT_TRUE(all_finite(dq32) && all_finite(dk32) && all_finite(dv32));
    EXPECT_LT(rel_error(minus(to_double(dq32), to_double(dq0)), ref_dq), 1e-5);
    EXPECT_LT(rel_error(minus(to_double(dk32), to_double(dk0)), ref_dk), 1e-5);
    EXPECT_LT(rel_error(minus(to_double(dv32), to_double(dv0)), ref_dv), 1e-5);
  }
}

// The gradient of sum(out * R) through positions, against central differences.
TEST(Attention, PositionsBackwardMatchesFiniteDifferences) {
  const PosShape s{1, 70, 75, 4, 2, 8};
  const auto q_pos = random_positions(s.Tq, 0, 120, 50),
             k_pos = random_positions(s.Tk, 10, 120, 51);
  auto q = randn(s.q_numel(), 52), kk = randn(s.kv_numel(), 53), v = randn(s.kv_numel(), 54);
  const auto R = randn(s.q_numel(), 55);
  std::vector<double> out(s.q_numel()), lse(s.B * s.Hq * s.Tq);
  auto objective = [&] {
    k::attention_forward(view(out, s.q()), view(lse, s.lse()), view(q, s.q()), view(kk, s.kv()),
                         view(v, s.kv()), view(q_pos, {s.Tq}), view(k_pos, {s.Tk}));
    return dot(out, R);
  };
  objective();
  std::vector<double> dq(q.size()), dk(kk.size()), dv(v.size());
  k::attention_backward(view(dq, s.q()), view(dk, s.kv()), view(dv, s.kv()), view(R, s.q()),
                        view(q, s.q()), view(kk, s.kv()), view(v, s.kv()), view(out, s.q()),
                        view(lse, s.lse()), view(q_pos, {s.Tq}), view(k_pos, {s.Tk}));
  expect_gradient("q", q, dq, objective, 300);
  expect_gradient("k", kk, dk, objective, 300);
  expect_gradient("v", v, dv, objective, 300);
}

TEST(Attention, PositionArgumentsAreChecked) {
  const PosShape s{1, 4, 6, 2, 1, 4};
  std::vector<float> q(s.q_numel()), kv(s.kv_numel()), out(s.q_numel());
  const std::vector<int32_t> q_pos{0, 1, 2, 3}, k_pos{0, 1, 2, 3, 4, 5}, bad{0, 2, 1, 3},
      short_pos{0, 1, 2};
  const std::vector<float> f_pos{0, 1, 2, 3};
  auto forward = [&](const Tensor& qp, const Tensor& kp) {
    k::attention_forward(view(out, s.q()), Tensor{}, view(q, s.q()), view(kv, s.kv()),
                         view(kv, s.kv()), qp, kp);
  };
  EXPECT_NO_THROW(forward(view(q_pos, {4}), view(k_pos, {6})));
  EXPECT_THROW(forward(Tensor{}, Tensor{}), std::exception);  // tq != tk needs positions
  EXPECT_THROW(forward(view(q_pos, {4}), Tensor{}), std::exception);
  EXPECT_THROW(forward(view(bad, {4}), view(k_pos, {6})), std::exception);
  EXPECT_THROW(forward(view(short_pos, {3}), view(k_pos, {6})), std::exception);
  EXPECT_THROW(forward(view(f_pos, {4}), view(k_pos, {6})), std::exception);
}

}  // namespace
}  // namespace pentad
