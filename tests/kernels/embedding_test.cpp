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

// out[b, i] = wte[tokens[b, i]] + wpe[positions[i]]; dwpe scatters by position. A rank
// holding zig-zag chunks gets the full sequence's rows at its positions, and the ranks'
// dwpe contributions add up to the full sequence's.
TEST(Embedding, ZigZagPositionsMatchTheFullSequenceRows) {
  const int64_t B = 2, T = 24, V = 9, C = 70, R = 2, chunk = T / (2 * R);
  const auto tokens = random_ids(B * T, V, 20);
  const auto wte = to_float(randn(V * C, 21)), wpe = to_float(randn(T * C, 22)),
             dout = to_float(randn(B * T * C, 23));
  std::vector<float> full(B * T * C), full_dwpe(T * C, 0.0f), sum_dwpe(T * C, 0.0f);
  k::embedding_forward(view(full, {B, T, C}), view(tokens, {B, T}), view(wte, {V, C}),
                       view(wpe, {T, C}));
  k::embedding_backward(Tensor{}, view(full_dwpe, {T, C}), view(dout, {B, T, C}),
                        view(tokens, {B, T}));
  for (int64_t r = 0; r < R; ++r) {
    std::vector<int32_t> pos;
    for (int64_t c : {r, 2 * R - 1 - r})
      for (int64_t t = c * chunk; t < (c + 1) * chunk; ++t) pos.push_back(static_cast<int32_t>(t));
    const int64_t n = static_cast<int64_t>(pos.size());
    std::vector<int32_t> my_tokens(B * n);
    std::vector<float> my_dout(B * n * C), want(B * n * C), out(B * n * C);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n; ++i) {
        my_tokens[b * n + i] = tokens[b * T + pos[i]];
        std::copy_n(&dout[(b * T + pos[i]) * C], C, &my_dout[(b * n + i) * C]);
        std::copy_n(&full[(b * T + pos[i]) * C], C, &want[(b * n + i) * C]);
      }
    k::embedding_forward(view(out, {B, n, C}), view(my_tokens, {B, n}), view(wte, {V, C}),
                         view(wpe, {T, C}), -1, view(pos, {n}));
    EXPECT_TRUE(bitwise_equal(out, want)) << "rank " << r;
    k::embedding_backward(Tensor{}, view(sum_dwpe, {T, C}), view(my_dout, {B, n, C}),
                          view(my_tokens, {B, n}), -1, view(pos, {n}));
  }
  // Each position belongs to one rank, so each row sums the same b terms in the same order.
  EXPECT_TRUE(bitwise_equal(sum_dwpe, full_dwpe));
}

// Positions 0..t-1 given explicitly, forward and backward (dwte too), as none.
TEST(Embedding, PositionsEqualToTheIndicesMatchAbsentOnes) {
  const int64_t B = 3, T = 10, V = 6, C = 5, max_T = 12;
  const auto tokens = random_ids(B * T, V, 30);
  const auto wte = to_float(randn(V * C, 31)), wpe = to_float(randn(max_T * C, 32)),
             dout = to_float(randn(B * T * C, 33));
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t);
  std::vector<float> out[2], dwte[2], dwpe[2];
  for (int with_pos = 0; with_pos < 2; ++with_pos) {
    const Tensor p = with_pos ? view(pos, {T}) : Tensor{};
    out[with_pos].assign(B * T * C, 0.0f), dwte[with_pos].assign(V * C, 1.0f),
        dwpe[with_pos].assign(max_T * C, 1.0f);
    k::embedding_forward(view(out[with_pos], {B, T, C}), view(tokens, {B, T}), view(wte, {V, C}),
                         view(wpe, {max_T, C}), -1, p);
    k::embedding_backward(view(dwte[with_pos], {V, C}), view(dwpe[with_pos], {max_T, C}),
                          view(dout, {B, T, C}), view(tokens, {B, T}), -1, p);
  }
  EXPECT_TRUE(bitwise_equal(out[0], out[1]));
  EXPECT_TRUE(bitwise_equal(dwte[0], dwte[1]));
  EXPECT_TRUE(bitwise_equal(dwpe[0], dwpe[1]));
}

TEST(Embedding, PositionsPastTheTableAreRejected) {
  const int64_t B = 1, T = 2, V = 3, C = 4;
  const std::vector<int32_t> tokens{0, 1}, pos{1, 5};
  const std::vector<float> wte(V * C), wpe(4 * C);
  std::vector<float> out(B * T * C);
  EXPECT_THROW(k::embedding_forward(view(out, {B, T, C}), view(tokens, {B, T}), view(wte, {V, C}),
                                    view(wpe, {4, C}), -1, view(pos, {T})),
               std::exception);
}

}  // namespace
}  // namespace pentad
