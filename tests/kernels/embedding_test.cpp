#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace pentad {
namespace {

using namespace testing;
namespace k = kernels;

TEST(Embedding, ForwardMatchesNaive) {
  const int64_t B = 2, T = 5, V = 4, C = 7, max_T = 8;
  const auto tokens = random_ids(B * T, V, 1);
  const auto wte = to_float(randn(V * C, 2)), wpe = to_float(randn(max_T * C, 3));
  for (bool with_wpe : {true, false}) {
    std::vector<float> out(B * T * C);
    k::embedding_forward(view(out, {B, T, C}), view(tokens, {B, T}), view(wte, {V, C}),
                         with_wpe ? view(wpe, {max_T, C}) : Tensor{});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < C; ++c)
          ASSERT_EQ(out[(b * T + t) * C + c],
                    wte[tokens[b * T + t] * C + c] + (with_wpe ? wpe[t * C + c] : 0.0f));
  }
}

// dwte and dwpe accumulate: they start from random values.
TEST(Embedding, BackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 5, V = 4, C = 7, max_T = 6;
  const auto tokens = random_ids(B * T, V, 4);
  auto wte = randn(V * C, 5), wpe = randn(max_T * C, 6);
  const auto R = randn(B * T * C, 7);
  std::vector<double> out(B * T * C);
  auto objective = [&] {
    k::embedding_forward(view(out, {B, T, C}), view(tokens, {B, T}), view(wte, {V, C}),
                         view(wpe, {max_T, C}));
    return dot(out, R);
  };
  const auto dwte0 = randn(V * C, 8), dwpe0 = randn(max_T * C, 9);
  auto dwte = dwte0, dwpe = dwpe0;
  k::embedding_backward(view(dwte, {V, C}), view(dwpe, {max_T, C}), view(R, {B, T, C}),
                        view(tokens, {B, T}));
  expect_gradient("wte", wte, minus(dwte, dwte0), objective);
  const auto dwpe_delta = minus(dwpe, dwpe0);
  // Rows past T get no gradient; the check below needs a nonzero gradient, so cut them.
  for (int64_t i = T * C; i < max_T * C; ++i) EXPECT_EQ(dwpe_delta[i], 0.0);
  expect_gradient("wpe", wpe, dwpe_delta, objective);
}

TEST(Embedding, BackwardIsDeterministicAndAccumulates) {
  const int64_t B = 4, T = 64, V = 10, C = 200;
  const auto tokens = random_ids(B * T, V, 10);
  const auto dout = to_float(randn(B * T * C, 11));
  std::vector<float> runs[3][2];
  for (int run = 0; run < 3; ++run) {
    runs[run][0].assign(V * C, 0.0f), runs[run][1].assign(T * C, 0.0f);
    for (int call = 0; call < (run == 2 ? 2 : 1); ++call)
      k::embedding_backward(view(runs[run][0], {V, C}), view(runs[run][1], {T, C}),
                            view(dout, {B, T, C}), view(tokens, {B, T}));
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(bitwise_equal(runs[0][i], runs[1][i]));
    // The second call adds row by row onto the first result, so doubling is not bitwise.
    std::vector<double> doubled(runs[0][i].begin(), runs[0][i].end());
    for (double& x : doubled) x *= 2;
    EXPECT_LT(rel_error(runs[2][i], doubled), 1e-5);
  }
}

TEST(Embedding, BadTokensAndShortWpeAreRejected) {
  const int64_t V = 4, C = 3;
  std::vector<float> wte(V * C), wpe(2 * C), out(1 * 3 * C);
  const std::vector<int32_t> bad = {0, 4, 1}, good = {0, 1, 2};
  EXPECT_THROW(
      k::embedding_forward(view(out, {1, 3, C}), view(bad, {1, 3}), view(wte, {V, C}), Tensor{}),
      std::exception);
  EXPECT_THROW(k::embedding_forward(view(out, {1, 3, C}), view(good, {1, 3}), view(wte, {V, C}),
                                    view(wpe, {2, C})),
               std::exception);
}

}  // namespace
}  // namespace pentad
