// Context-parallel attention (parallel/cp/context_parallel.h) on 4 ranks against the
// attention kernels on the whole sequence: Ulysses, ring (zig-zag) and their hybrid, with
// grouped-query heads fewer than the Ulysses degree; and the ring's transfers in flight
// while blocks compute, from the communication trace.
#include "parallel/cp/context_parallel.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "kernels/ops.h"

using namespace pentad;
using namespace pentad::parallel;

namespace {

std::unique_ptr<Communicator> split_world(int color, const char* name) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm part = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, rank, &part);
  auto comm = make_communicator(Backend::MPI, part, name);
  MPI_Comm_free(&part);
  return comm;
}

std::vector<float> random_values(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Rows (b, positions, heads, d) of a (b, T, heads, d) tensor.
std::vector<float> take_rows(const std::vector<float>& full, int64_t B, int64_t T, int64_t H,
                             int64_t D, const std::vector<int32_t>& pos) {
  std::vector<float> out;
  for (int64_t b = 0; b < B; ++b)
    for (int32_t p : pos)
      out.insert(out.end(), full.begin() + (b * T + p) * H * D,
                 full.begin() + (b * T + p + 1) * H * D);
  return out;
}

// Within 1e-5 of the reference, relative to its norm: the blocks sum in another order.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  EXPECT_LT(std::sqrt(diff / norm), 1e-5) << what;
}

struct Case {
  int ulysses;  // Ulysses degree; the ring is 4 / ulysses
  int64_t heads, kv_heads;
};

void check_against_whole_sequence(const Case& c) {
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ASSERT_EQ(world, 4) << "run under mpirun -np 4";
  const int U = c.ulysses, R = world / U, u = rank % U, r = rank / U;
  auto uly = split_world(r, "cp_ulysses"), ring = split_world(u, "cp_ring");
  const int64_t B = 2, T = 48, Hq = c.heads, Hkv = c.kv_heads, D = 8;
  const size_t nq = size_t(B * T * Hq * D), nkv = size_t(B * T * Hkv * D);
  // The whole problem, the same on every rank.
  std::vector<float> q = random_values(nq, 1), k = random_values(nkv, 2), v = random_values(nkv, 3),
                     dout = random_values(nq, 4);
  std::vector<float> out(nq), lse(size_t(B * Hq * T)), dq(nq), dk(nkv), dv(nkv);
  kernels::attention_forward(
      view_of(out.data(), Shape{B, T, Hq, D}), view_of(lse.data(), Shape{B, Hq, T}),
      view_of(q.data(), Shape{B, T, Hq, D}), view_of(k.data(), Shape{B, T, Hkv, D}),
      view_of(v.data(), Shape{B, T, Hkv, D}));
  kernels::attention_backward(
      view_of(dq.data(), Shape{B, T, Hq, D}), view_of(dk.data(), Shape{B, T, Hkv, D}),
      view_of(dv.data(), Shape{B, T, Hkv, D}), view_of(dout.data(), Shape{B, T, Hq, D}),
      view_of(q.data(), Shape{B, T, Hq, D}), view_of(k.data(), Shape{B, T, Hkv, D}),
      view_of(v.data(), Shape{B, T, Hkv, D}), view_of(out.data(), Shape{B, T, Hq, D}),
      view_of(lse.data(), Shape{B, Hq, T}));

  ContextParallel cp(uly.get(), ring.get(), {B, T, Hq, Hkv, D}, DType::F32, Device::CPU);
  const std::vector<int32_t>& pos = cp.positions();
  ASSERT_EQ(pos, context_positions(T, U, R, u, r));
  const int64_t t = int64_t(pos.size());
  std::vector<float> lq = take_rows(q, B, T, Hq, D, pos), lk = take_rows(k, B, T, Hkv, D, pos),
                     lv = take_rows(v, B, T, Hkv, D, pos),
                     ldout = take_rows(dout, B, T, Hq, D, pos);
  std::vector<float> lout(lq.size()), llse(size_t(B * Hq * t)), ldq(lq.size()), ldk(lk.size()),
      ldv(lv.size());
  const Shape qs{B, t, Hq, D}, ks{B, t, Hkv, D};
  cp.forward(view_of(lout.data(), qs), view_of(llse.data(), Shape{B, Hq, t}),
             view_of(lq.data(), qs), view_of(lk.data(), ks), view_of(lv.data(), ks));
  expect_close(lout, take_rows(out, B, T, Hq, D, pos), "out");
  cp.backward(view_of(ldq.data(), qs), view_of(ldk.data(), ks), view_of(ldv.data(), ks),
              view_of(ldout.data(), qs), view_of(lq.data(), qs), view_of(lk.data(), ks),
              view_of(lv.data(), ks), view_of(lout.data(), qs),
              view_of(llse.data(), Shape{B, Hq, t}));
  expect_close(ldq, take_rows(dq, B, T, Hq, D, pos), "dq");
  expect_close(ldk, take_rows(dk, B, T, Hkv, D, pos), "dk");
  expect_close(ldv, take_rows(dv, B, T, Hkv, D, pos), "dv");
}

}  // namespace

TEST(ContextPositions, ZigZagChunksAndUlyssesPieces) {
  EXPECT_EQ(context_positions(8, 1, 2, 0, 0), (std::vector<int32_t>{0, 1, 6, 7}));
  EXPECT_EQ(context_positions(8, 1, 2, 0, 1), (std::vector<int32_t>{2, 3, 4, 5}));
  EXPECT_EQ(context_positions(8, 2, 1, 1, 0), (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(context_positions(8, 2, 2, 1, 0), (std::vector<int32_t>{6, 7}));
  // Every position once over the ranks.
  std::vector<int> seen(48, 0);
  for (int u = 0; u < 3; ++u)
    for (int r = 0; r < 2; ++r)
      for (int32_t p : context_positions(48, 3, 2, u, r)) ++seen[size_t(p)];
  EXPECT_EQ(seen, std::vector<int>(48, 1));
}

TEST(ContextParallel, UlyssesMatchesTheWholeSequence) {
  check_against_whole_sequence({4, 4, 4});
}
TEST(ContextParallel, UlyssesReplicatesFewerKvHeads) {
  check_against_whole_sequence({4, 8, 2});
}
TEST(ContextParallel, UlyssesWithOneKvHead) {
  check_against_whole_sequence({4, 4, 1});
}
TEST(ContextParallel, RingMatchesTheWholeSequence) {
  check_against_whole_sequence({1, 4, 2});
}
TEST(ContextParallel, HybridMatchesTheWholeSequence) {
  check_against_whole_sequence({2, 4, 2});
}

// Each ring step's next K/V block is posted before the step's attention begins and is
// still pending (not yet seen complete) when the attention ends.
TEST(ContextParallel, RingTransfersOverlapTheBlocks) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  auto ring = make_communicator(Backend::MPI, MPI_COMM_WORLD, "cp_ring_overlap");
  const int64_t B = 1, T = 512, H = 4, D = 16;
  ContextParallel cp(nullptr, ring.get(), {B, T, H, H, D}, DType::F32, Device::CPU);
  const int64_t t = cp.local_len();
  std::vector<float> q = random_values(size_t(B * t * H * D), 5), k = q, v = q, out(q.size()),
                     lse(size_t(B * H * t));
  const Shape s{B, t, H, D};
  cp.forward(view_of(out.data(), s), view_of(lse.data(), Shape{B, H, t}), view_of(q.data(), s),
             view_of(k.data(), s), view_of(v.data(), s));
  const auto& spans = cp.ring_compute_spans();
  ASSERT_EQ(int(spans.size()), world);
  std::vector<CommEvent> recvs;
  for (const CommEvent& e : comm_events())
    if (e.name() == "cp_ring_overlap" && e.kind == CommKind::Recv) recvs.push_back(e);
  ASSERT_EQ(int(recvs.size()), world - 1);
  for (int s = 0; s + 1 < world; ++s) {
    EXPECT_LE(recvs[size_t(s)].enter_ns, spans[size_t(s)].begin_ns) << "step " << s;
    EXPECT_GE(recvs[size_t(s)].leave_ns, spans[size_t(s)].end_ns) << "step " << s;
  }
}
