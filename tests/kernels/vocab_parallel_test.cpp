// The vocabulary-parallel kernels of tensor parallelism: split into shards and combined
// with the reductions done by hand, they give what the whole-vocabulary kernels give.
#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace pentad {
namespace {

using namespace testing;
namespace k = kernels;

// Cross-entropy over 3 uneven vocabulary shards (max and sum "all-reduced" here) equals
// the fused kernel: losses and every column of dlogits.
TEST(VocabParallel, CrossEntropyOverShardsEqualsWhole) {
  const int64_t N = 6, V = 23;
  const std::vector<int64_t> starts = {0, 8, 15, V};
  const auto logits = randn(static_cast<size_t>(N * V), 3, 4.0);
  const auto targets = random_ids(N, V, 5);
  const double dloss = 0.125;
  std::vector<double> losses(N), dlogits(logits.size());
  k::crossentropy_forward_backward(view(losses, Shape{N}), view(dlogits, Shape{N, V}),
                                   view(logits, Shape{N, V}), view(targets, Shape{N}),
                                   static_cast<float>(dloss));

  const size_t shards = starts.size() - 1;
  std::vector<std::vector<double>> part(shards);
  for (size_t s = 0; s < shards; ++s) {
    const int64_t w = starts[s + 1] - starts[s];
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < w; ++j)
        part[s].push_back(logits[static_cast<size_t>(n * V + starts[s] + j)]);
  }
  auto shape = [&](size_t s) { return Shape{N, starts[s + 1] - starts[s]}; };
  std::vector<double> row_max(N, -1e300), stats(2 * N, 0.0);
  for (size_t s = 0; s < shards; ++s) {  // phase 1 + all-reduce MAX
    std::vector<double> m(N);
    k::vocab_parallel_ce_max(view(m, Shape{N}), view(part[s], shape(s)));
    for (int64_t n = 0; n < N; ++n) row_max[n] = std::max(row_max[n], m[n]);
  }
  for (size_t s = 0; s < shards; ++s) {  // phase 2 + all-reduce SUM
    std::vector<double> st(2 * N);
    k::vocab_parallel_ce_stats(view(st, Shape{2, N}), view(part[s], shape(s)),
                               view(row_max, Shape{N}), view(targets, Shape{N}), starts[s]);
    for (int64_t i = 0; i < 2 * N; ++i) stats[i] += st[i];
  }
  for (size_t s = 0; s < shards; ++s) {  // phase 3, dlogits in place of the logits
    std::vector<double> l(N);
    std::vector<double> d = part[s];
    k::vocab_parallel_ce_finish(view(l, Shape{N}), view(d, shape(s)), view(d, shape(s)),
                                view(row_max, Shape{N}), view(stats, Shape{2, N}),
                                view(targets, Shape{N}), starts[s], static_cast<float>(dloss));
    const int64_t w = starts[s + 1] - starts[s];
    for (int64_t n = 0; n < N; ++n) {
      EXPECT_NEAR(l[n], losses[n], 1e-12) << "shard " << s << " row " << n;
      for (int64_t j = 0; j < w; ++j)
        EXPECT_NEAR(d[n * w + j], dlogits[n * V + starts[s] + j], 1e-14) << "shard " << s;
    }
  }
}

// Embedding rows held by shards: the shards' outputs sum to the whole table's output, and
// their gradients are the matching rows of the whole gradient.
TEST(VocabParallel, EmbeddingOverShardsEqualsWhole) {
  const int64_t B = 2, T = 5, V = 9, C = 4;
  const std::vector<int64_t> starts = {0, 4, V};
  const auto wte = randn(static_cast<size_t>(V * C), 7);
  const auto tokens = random_ids(B * T, V, 8);
  const auto dout = randn(static_cast<size_t>(B * T * C), 9);
  std::vector<double> out(B * T * C), dwte(V * C, 0.0);
  k::embedding_forward(view(out, Shape{B, T, C}), view(tokens, Shape{B, T}), view(wte, Shape{V, C}),
                       Tensor{});
  k::embedding_backward(view(dwte, Shape{V, C}), Tensor{}, view(dout, Shape{B, T, C}),
                        view(tokens, Shape{B, T}));
  std::vector<double> sum(out.size(), 0.0);
  for (size_t s = 0; s + 1 < starts.size(); ++s) {
    const int64_t rows = starts[s + 1] - starts[s];
    std::vector<double> shard(wte.begin() + starts[s] * C, wte.begin() + starts[s + 1] * C);
    std::vector<double> o(out.size()), g(static_cast<size_t>(rows * C), 0.0);
    k::embedding_forward(view(o, Shape{B, T, C}), view(tokens, Shape{B, T}),
                         view(shard, Shape{rows, C}), Tensor{}, starts[s]);
    for (size_t i = 0; i < o.size(); ++i) sum[i] += o[i];
    k::embedding_backward(view(g, Shape{rows, C}), Tensor{}, view(dout, Shape{B, T, C}),
                          view(tokens, Shape{B, T}), starts[s]);
    for (int64_t i = 0; i < rows * C; ++i)
      EXPECT_EQ(g[i], dwte[starts[s] * C + i]) << "shard " << s;
  }
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(sum[i], out[i]);
}

}  // namespace
}  // namespace pentad
