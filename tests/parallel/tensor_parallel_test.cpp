// Megatron's f and g over a tp group of every rank (parallel/tp/tensor_parallel.h), with
// and without sequence parallelism, against the sums and concatenations they stand for.
#include "parallel/tp/tensor_parallel.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

using namespace pentad;
using namespace pentad::parallel;

namespace {

constexpr int64_t kRowsPerRank = 2, kWidth = 3;

// A value that differs by rank, row and column.
float value(int rank, int64_t row, int64_t col) {
  return float(100 * rank + 10 * row + col);
}

}  // namespace

TEST(TensorParallel, FAndGWithoutSequenceParallelism) {
  auto group = make_communicator(Backend::MPI, MPI_COMM_WORLD, "tp");
  const int p = group->size(), r = group->rank();
  TensorParallel tp(group.get(), false);
  EXPECT_EQ(tp.degree(), p);
  EXPECT_FALSE(tp.sequence_parallel());
  const int64_t n = kRowsPerRank * p;
  std::vector<float> x(size_t(n * kWidth)), sum(x.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < kWidth; ++j) {
      x[size_t(i * kWidth + j)] = value(r, i, j);
      for (int q = 0; q < p; ++q) sum[size_t(i * kWidth + j)] += value(q, i, j);
    }
  const Tensor t = view_of(x.data(), Shape{n, kWidth});
  std::vector<float> before = x;
  tp.f_forward(t, t);   // identity
  tp.g_backward(t, t);  // identity
  EXPECT_EQ(x, before);
  tp.f_backward(t, t);  // all-reduce
  EXPECT_EQ(x, sum);
  x = before;
  tp.g_forward(t, t);  // all-reduce
  EXPECT_EQ(x, sum);
}

TEST(TensorParallel, FAndGWithSequenceParallelism) {
  auto group = make_communicator(Backend::MPI, MPI_COMM_WORLD, "tp_sp");
  const int p = group->size(), r = group->rank();
  TensorParallel tp(group.get(), true);
  EXPECT_EQ(tp.sequence_parallel(), p > 1);  // one rank has nothing to shard
  if (p < 2) GTEST_SKIP() << "needs mpirun with at least 2 ranks";
  const int64_t n = kRowsPerRank * p;
  std::vector<float> local(size_t(kRowsPerRank * kWidth)), full(size_t(n * kWidth));
  const Tensor lt = view_of(local.data(), Shape{kRowsPerRank, kWidth});
  const Tensor ft = view_of(full.data(), Shape{n, kWidth});
  // f forward (and g backward): every rank's rows, concatenated in rank order.
  for (int64_t i = 0; i < kRowsPerRank; ++i)
    for (int64_t j = 0; j < kWidth; ++j) local[size_t(i * kWidth + j)] = value(r, i, j);
  for (auto gather : {&TensorParallel::f_forward, &TensorParallel::g_backward}) {
    std::fill(full.begin(), full.end(), -1.0f);
    (tp.*gather)(ft, lt);
    for (int q = 0; q < p; ++q)
      for (int64_t i = 0; i < kRowsPerRank; ++i)
        for (int64_t j = 0; j < kWidth; ++j)
          EXPECT_EQ(full[size_t((q * kRowsPerRank + i) * kWidth + j)], value(q, i, j));
  }
  // g forward (and f backward): the sum over ranks of the whole rows, this rank's share.
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < kWidth; ++j) full[size_t(i * kWidth + j)] = value(r, i, j);
  for (auto scatter : {&TensorParallel::g_forward, &TensorParallel::f_backward}) {
    std::fill(local.begin(), local.end(), -1.0f);
    (tp.*scatter)(lt, ft);
    for (int64_t i = 0; i < kRowsPerRank; ++i)
      for (int64_t j = 0; j < kWidth; ++j) {
        float want = 0.0f;
        for (int q = 0; q < p; ++q) want += value(q, r * kRowsPerRank + i, j);
        EXPECT_EQ(local[size_t(i * kWidth + j)], want);
      }
  }
}
