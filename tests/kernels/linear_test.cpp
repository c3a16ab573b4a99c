#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace pentad {
namespace {

using namespace testing;
namespace k = kernels;

// out (N, OC) = inp (N, C) @ w^T + b, in double.
std::vector<double> naive_linear(const std::vector<double>& inp, const std::vector<double>& w,
                                 const std::vector<double>* bias, int64_t N, int64_t C,
                                 int64_t OC) {
  std::vector<double> out(static_cast<size_t>(N * OC));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = bias ? (*bias)[static_cast<size_t>(o)] : 0.0;
      for (int64_t c = 0; c < C; ++c)
        s += inp[static_cast<size_t>(n * C + c)] * w[static_cast<size_t>(o * C + c)];
      out[static_cast<size_t>(n * OC + o)] = s;
    }
  return out;
}

struct LinearShape {
  int64_t N, C, OC;
};

TEST(Linear, ForwardMatchesNaiveInFloat) {
  for (LinearShape s : {LinearShape{5, 7, 3}, {33, 64, 17}, {1, 1, 1}, {70, 129, 65}}) {
    for (bool with_bias : {true, false}) {
      const auto inp = randn(static_cast<size_t>(s.N * s.C), 1);
      const auto w = randn(static_cast<size_t>(s.OC * s.C), 2);
      const auto b = randn(static_cast<size_t>(s.OC), 3);
      const auto inp_f = to_float(inp), w_f = to_float(w), b_f = to_float(b);
      std::vector<float> out(static_cast<size_t>(s.N * s.OC), 99.0f);
      k::linear_forward(view(out, {s.N, s.OC}), view(inp_f, {s.N, s.C}), view(w_f, {s.OC, s.C}),
                        with_bias ? view(b_f, {s.OC}) : Tensor{});
      const auto ref =
          naive_linear(to_double(inp_f), to_double(w_f), with_bias ? &b : nullptr, s.N, s.C, s.OC);
      EXPECT_LT(rel_error(out, ref), 1e-5)
          << s.N << "x" << s.C << "x" << s.OC << " bias " << with_bias;
    }
  }
}

TEST(Linear, LeadingDimsFlattenIntoRows) {
  const auto inp = to_float(randn(2 * 3 * 7, 4)), w = to_float(randn(5 * 7, 5));
  std::vector<float> out3(2 * 3 * 5), out2(2 * 3 * 5);
  k::linear_forward(view(out3, {2, 3, 5}), view(inp, {2, 3, 7}), view(w, {5, 7}), Tensor{});
  k::linear_forward(view(out2, {6, 5}), view(inp, {6, 7}), view(w, {5, 7}), Tensor{});
  EXPECT_TRUE(bitwise_equal(out3, out2));
}

// Backward against central differences of L = sum(out * R), in double. Parameter grads
// start from random values (they accumulate); dinp starts from garbage (overwritten) or
// from random values when accumulate_dinp.
TEST(Linear, BackwardMatchesFiniteDifferences) {
  const int64_t N = 5, C = 7, OC = 3;
  for (bool accumulate_dinp : {false, true}) {
    auto inp = randn(N * C, 10), w = randn(OC * C, 11), b = randn(OC, 12);
    const auto R = randn(N * OC, 13);
    std::vector<double> out(N * OC);
    auto objective = [&] {
      k::linear_forward(view(out, {N, OC}), view(inp, {N, C}), view(w, {OC, C}), view(b, {OC}));
      return dot(out, R);
    };
    const auto dinp0 = accumulate_dinp ? randn(N * C, 14) : std::vector<double>(N * C, 1e30);
    const auto dw0 = randn(OC * C, 15), db0 = randn(OC, 16);
    auto dinp = dinp0, dw = dw0, db = db0;
    k::linear_backward(view(dinp, {N, C}), view(dw, {OC, C}), view(db, {OC}), view(R, {N, OC}),
                       view(inp, {N, C}), view(w, {OC, C}), accumulate_dinp);
    expect_gradient("inp", inp, accumulate_dinp ? minus(dinp, dinp0) : dinp, objective);
    expect_gradient("weight", w, minus(dw, dw0), objective);
    expect_gradient("bias", b, minus(db, db0), objective);
  }
}

TEST(Linear, ParameterGradsAccumulateAndAbsentGradsAreSkipped) {
  const int64_t N = 9, C = 6, OC = 4;
  const auto inp = randn(N * C, 20), w = randn(OC * C, 21), dout = randn(N * OC, 22);
  std::vector<double> dw1(OC * C, 0.0), db1(OC, 0.0), dw2(OC * C, 0.0), db2(OC, 0.0);
  k::linear_backward(Tensor{}, view(dw1, {OC, C}), view(db1, {OC}), view(dout, {N, OC}),
                     view(inp, {N, C}), view(w, {OC, C}), false);
  for (int i = 0; i < 2; ++i)
    k::linear_backward(Tensor{}, view(dw2, {OC, C}), view(db2, {OC}), view(dout, {N, OC}),
                       view(inp, {N, C}), view(w, {OC, C}), false);
  for (size_t i = 0; i < dw1.size(); ++i) EXPECT_DOUBLE_EQ(dw2[i], 2 * dw1[i]);
  for (size_t i = 0; i < db1.size(); ++i) EXPECT_DOUBLE_EQ(db2[i], 2 * db1[i]);
  EXPECT_GT(rel_error(dw1, std::vector<double>(dw1.size(), 0.0), 1.0), 0.0);
}

TEST(Linear, BackwardIsDeterministic) {
  const int64_t N = 300, C = 96, OC = 130;
  const auto inp = to_float(randn(N * C, 30)), w = to_float(randn(OC * C, 31));
  const auto dout = to_float(randn(N * OC, 32));
  std::vector<float> runs[2][3];
  for (auto& r : runs) {
    r[0].assign(N * C, 0.0f), r[1].assign(OC * C, 0.0f), r[2].assign(OC, 0.0f);
    k::linear_backward(view(r[0], {N, C}), view(r[1], {OC, C}), view(r[2], {OC}),
                       view(dout, {N, OC}), view(inp, {N, C}), view(w, {OC, C}), false);
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(bitwise_equal(runs[0][i], runs[1][i])) << i;
}

}  // namespace
}  // namespace pentad
