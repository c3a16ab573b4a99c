// The expert-parallel token dispatcher (parallel/ep/expert_parallel.h) on host rows, on 4
// ranks folded as ep 4, ep 2 x etp 2 and etp 4 over dp 4:
//  - dispatch() leaves each local expert's rows contiguous, in expert-major order, and every
//    row there was sent for that expert by some rank;
//  - the counts add up: each rank receives what the ranks of its groups sent its experts;
//  - combine() inverts it: partial outputs (each etp rank's own multiple of the dispatched
//    rows) come back to the rows' senders, in their order, summed over etp.
// Uneven counts (zeros included) and a second, larger round on the same dispatcher (its
// staging grown) are part of each layout, and every round runs again with bf16 rows
// (check_bf16_round): 2 bytes an element through the same exchange. The CUDA path shares this code
// with device staging (tests/cuda/cuda_moe_test.cpp).
#include "parallel/ep/expert_parallel.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <numeric>
#include <span>
#include <vector>

#include "core/bf16.h"
#include "parallel/mesh.h"
#include "tests/parallel/mpi_test_util.h"

namespace pentad::parallel {
namespace {

constexpr int64_t kExperts = 4, kWidth = 3;

using mpi_test::world_size;

// A row's value tags its sender, expert and index: (sender * 100 + expert * 10 + j) * 8 + c,
// exact in f32 and the same in every column but for c.
float tag(int sender, int64_t expert, int64_t j, int64_t c) {
  return float(((sender * 100 + expert * 10 + j) * 8) + c);
}
int64_t expert_of(float value) {
  return (int64_t(value) / 8) % 100 / 10;
}

// The bf16 round on the same dispatcher and counts, after the f32 one: 2-byte rows through
// the same all-to-alls, all-gather and reduce-scatter (MPI moves them as 16-bit words and
// sums them with its bf16 op). Rows in: the f32 round's rows rounded to bf16.
//  - dispatch moves words, no arithmetic: its rows are the f32 round's dispatched rows
//    rounded to bf16, word for word;
//  - combine: each etp rank scales its bf16 rows by rank + 1 (rounded to bf16, exact for
//    scales 1, 2 and 4) and the reduce-scatter sums them. With etp 1 or 2 that is one f32 sum
//    of exact values rounded once: the f32 result rounded, word for word. With etp 4 the
//    partial sums round in an order MPI picks: within 2^-6 relative of the f32 result.
// Rows copied with a wrong element size (4 bytes) land at the wrong offsets and match none.
void check_bf16_round(ExpertParallel& ep, Communicator& etp, std::span<const int64_t> send,
                      std::span<const int64_t> counts, const std::vector<float>& in,
                      const std::vector<float>& dispatched, int round) {
  const int64_t A = int64_t(in.size()) / kWidth, R = int64_t(dispatched.size()) / kWidth;
  std::vector<uint16_t> in16(in.size()), out16(dispatched.size(), 0xffff);
  for (size_t n = 0; n < in.size(); ++n) in16[n] = float_to_bf16(in[n]);
  ep.dispatch(send, counts, view_of(in16.data(), Shape{A, kWidth}, DType::BF16),
              view_of(out16.data(), Shape{R, kWidth}, DType::BF16));
  for (size_t n = 0; n < dispatched.size(); ++n)
    ASSERT_EQ(out16[n], float_to_bf16(dispatched[n])) << "round " << round << ", element " << n;

  const int Q = etp.size();
  const float scale = float(etp.rank() + 1);
  for (uint16_t& v : out16) v = float_to_bf16(scale * bf16_to_float(v));
  std::vector<uint16_t> back16(in.size(), 0xffff);
  ep.combine(send, counts, view_of(out16.data(), Shape{R, kWidth}, DType::BF16),
             view_of(back16.data(), Shape{A, kWidth}, DType::BF16));
  const float total = float(Q * (Q + 1) / 2);
  for (size_t n = 0; n < in.size(); ++n) {
    // The f32 round's combine of the rounded rows: what the bf16 one rounds.
    const float want = total * bf16_to_float(in16[n]);
    if (Q <= 2) {
      ASSERT_EQ(back16[n], float_to_bf16(want)) << "round " << round << ", element " << n;
    } else {
      ASSERT_NEAR(bf16_to_float(back16[n]), want, std::abs(want) / 64)
          << "round " << round << ", element " << n;
    }
  }
}

// ep_rank: this rank's coordinate in its ep group, whose experts it holds.
void check_round(ExpertParallel& ep, int ep_rank, Communicator& etp, int world_rank, int round) {
  // This rank sends (rank + e + round) % 3 rows to expert e: uneven, some zero.
  std::vector<int64_t> send(kExperts);
  for (int64_t e = 0; e < kExperts; ++e) send[size_t(e)] = (world_rank + e + round) % 3 + round;
  const int64_t A = std::accumulate(send.begin(), send.end(), int64_t{0});
  std::vector<float> in(size_t(A * kWidth));
  for (int64_t e = 0, at = 0; e < kExperts; ++e)
    for (int64_t j = 0; j < send[size_t(e)]; ++j, ++at)
      for (int64_t c = 0; c < kWidth; ++c) in[size_t(at * kWidth + c)] = tag(world_rank, e, j, c);

  const std::vector<int64_t> counts = ep.exchange_counts(send);
  const std::vector<int64_t> rows = ep.expert_rows(counts);
  const int64_t R = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  EXPECT_EQ(R, std::accumulate(counts.begin(), counts.end(), int64_t{0}));
  std::vector<float> out(size_t(R * kWidth), -1.0f);
  ep.dispatch(send, counts, view_of(in.data(), Shape{A, kWidth}),
              view_of(out.data(), Shape{R, kWidth}));
  const std::vector<float> dispatched = out;

  // Expert-major: local expert i's rows are one block, each a whole row sent for it.
  for (int64_t i = 0, at = 0; i < ep.local_experts(); ++i) {
    int64_t expert = -1;
    for (int64_t r = 0; r < rows[size_t(i)]; ++r, ++at) {
      const float* row = out.data() + at * kWidth;
      if (expert < 0) expert = expert_of(row[0]);
      EXPECT_EQ(expert_of(row[0]), expert) << "round " << round << ", local expert " << i;
      for (int64_t c = 0; c < kWidth; ++c) EXPECT_EQ(row[c] - row[0], float(c));
    }
    if (expert >= 0) {
      EXPECT_EQ(expert, ep_rank * ep.local_experts() + i) << "round " << round;
    }
  }

  // Each etp rank scales the rows by its rank + 1; combine sums them over etp.
  const int Q = etp.size();
  const float scale = float(etp.rank() + 1), total = float(Q * (Q + 1) / 2);
  for (float& v : out) v *= scale;
  std::vector<float> back(size_t(A * kWidth), -1.0f);
  ep.combine(send, counts, view_of(out.data(), Shape{R, kWidth}),
             view_of(back.data(), Shape{A, kWidth}));
  for (int64_t n = 0; n < A * kWidth; ++n)
    ASSERT_EQ(back[size_t(n)], total * in[size_t(n)]) << "round " << round << ", element " << n;

  check_bf16_round(ep, etp, send, counts, in, dispatched, round);
}

void check_layout(int ep_degree, int etp_degree) {
  MeshConfig c;
  c.dp = world_size();
  c.ep = ep_degree;
  c.etp = etp_degree;
  Mesh mesh = Mesh::create(c, MPI_COMM_WORLD);
  ExpertParallel ep(mesh.group(Axis::EP), mesh.group(Axis::ETP), kExperts);
  EXPECT_EQ(ep.local_experts(), kExperts / ep_degree);
  for (int round = 0; round < 2; ++round)
    check_round(ep, mesh.group(Axis::EP).rank(), mesh.group(Axis::ETP), mesh.world_rank(), round);
}

TEST(ExpertParallel, DispatchGroupsByExpertAndCombineSumsOverEtp) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_layout(4, 1);
  check_layout(2, 2);
  check_layout(1, 4);
}

}  // namespace
}  // namespace pentad::parallel
