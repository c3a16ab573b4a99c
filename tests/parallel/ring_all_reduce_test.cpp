// Pentad's ring all-reduce and reduce-scatter (parallel/ring_all_reduce.cpp) against the closed
// form and MPI's own, and the link matrix they feed (parallel/activity.h): a slow link between
// two ranks shows at both its ends.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "parallel/activity.h"
#include "parallel/comm.h"

namespace pentad::parallel {
namespace {

Tensor view(std::vector<float>& v) {
  return view_of(v.data(), Shape{int64_t(v.size())}, DType::F32);
}

class RingTest : public testing::Test {
 protected:
  void SetUp() override {
    ring = make_communicator(Backend::MPI, MPI_COMM_WORLD, "ring");
    ring->set_ring_all_reduce(true);
    r = ring->rank();
    n = ring->size();
    if (n < 2) GTEST_SKIP() << "run under mpirun with at least 2 ranks";
  }
  std::unique_ptr<Communicator> ring;
  int r = 0, n = 1;
};

TEST_F(RingTest, SumsEveryElementForAnySizeAsMpiDoesWithinRounding) {
  auto mpi = make_communicator(Backend::MPI, MPI_COMM_WORLD, "mpi");
  // Fewer elements than ranks (empty chunks), uneven chunks, and a few thousand.
  for (int64_t k : {int64_t(1), int64_t(n + 1), int64_t(4099)}) {
    std::vector<float> exact(static_cast<size_t>(k)), ours = exact, theirs = exact;
    for (int64_t i = 0; i < k; ++i) exact[size_t(i)] = float(r * 10 + i % 7);  // exact in f32
    for (int64_t i = 0; i < k; ++i) ours[size_t(i)] = theirs[size_t(i)] = std::sin(float(r + i));
    ring->all_reduce(view(exact));
    ring->all_reduce(view(ours));
    mpi->all_reduce(view(theirs));
    for (int64_t i = 0; i < k; ++i) {
      ASSERT_EQ(exact[size_t(i)], float(10 * n * (n - 1) / 2 + n * (i % 7))) << k << " " << i;
      ASSERT_NEAR(ours[size_t(i)], theirs[size_t(i)], 1e-5f) << k << " " << i;
    }
    // Every rank holds the same bits: rank 0's copy, broadcast, equals each rank's own.
    std::vector<float> zeros = ours;
    mpi->broadcast(view(zeros), 0);
    EXPECT_TRUE(std::equal(ours.begin(), ours.end(), zeros.begin())) << k;
  }
}

TEST_F(RingTest, OverlappingAsyncAllReducesDoNotMixTheirLegs) {
  std::vector<float> a(1000, float(r)), b(1000, float(2 * r + 1));
  Work wa = ring->all_reduce(view(a), ReduceOp::Sum, true);
  Work wb = ring->all_reduce(view(b), ReduceOp::Sum, true);
  wb.wait();  // the later one first: its legs must not take the earlier one's messages
  wa.wait();
  EXPECT_EQ(a[999], float(n * (n - 1) / 2));
  EXPECT_EQ(b[0], float(n * n));
}

TEST_F(RingTest, ASlowLinkShowsAtBothItsEnds) {
  if (n < 3) GTEST_SKIP() << "a link matrix needs 3 ranks";
  const double delay_s = 0.02;
  // Link 0 - 1: the ring sends across it from 0 to 1 only.
  ring->set_injection(Injection{delay_s, 0, 0, /*links_only=*/true, /*link_peer=*/1});
  std::vector<float> x(64 * 1024, 1.0f);
  // Five all-reduces of 2 (n - 1) legs: the last kLinkSamples sends are all slow ones.
  for (int i = 0; i < 5; ++i) ring->all_reduce(view(x));
  EXPECT_EQ(x[5], float(n * n * n * n * n));
  ring->set_injection(Injection{});
  const std::vector<LinkCost> links = activity_links();
  ASSERT_EQ(links.size(), 2u);  // a ring sends to its right and receives from its left
  const LinkCost& right = links[0].peer == (r + 1) % n ? links[0] : links[1];
  const LinkCost& left = links[0].peer == (r + n - 1) % n ? links[0] : links[1];
  EXPECT_EQ(right.recv_s_per_mb, -1.0);
  EXPECT_EQ(left.send_s_per_mb, -1.0);
  const double mb = double(x.size() * sizeof(float) / size_t(n)) / double(1 << 20);
  // Both ends of the link see it: 0 in its sends, 1 in its receives. (Others are not asserted
  // fast: a shared machine may deschedule a rank; the detector's rule is tested on its own.)
  if (r == 0) {
    EXPECT_GE(right.send_s_per_mb, 0.9 * delay_s / mb);
  }
  if (r == 1) {
    EXPECT_GE(left.recv_s_per_mb, 0.9 * delay_s / mb);
  }
}

// reduce_scatter_v of f32 host memory always runs as the ring (ZeRO's gradient buckets):
// each rank's block equals that block of MPI's all-reduce within rounding, uneven, empty and
// sliced blocks included, `in` untouched, nothing written past the block; two in flight at once
// keep their legs apart.
TEST_F(RingTest, ReduceScatterGivesEachRankItsBlock) {
  auto mpi = make_communicator(Backend::MPI, MPI_COMM_WORLD, "mpi");
  // The largest: blocks of more than 2^20 elements, which go around in 4 MiB slices.
  for (int64_t scale : {int64_t(1), int64_t(1000), int64_t(600000)}) {
    std::vector<int64_t> counts(static_cast<size_t>(n));
    int64_t total = 0, mine = 0;
    for (int q = 0; q < n; ++q) {
      counts[size_t(q)] = q == 1 ? 0 : scale * (q + 1) + q;
      if (q == r) mine = total;
      total += counts[size_t(q)];
    }
    std::vector<float> in(static_cast<size_t>(total)), reference(static_cast<size_t>(total));
    for (int64_t i = 0; i < total; ++i)
      in[size_t(i)] = reference[size_t(i)] = std::sin(float(r + i));
    const std::vector<float> before = in;
    std::vector<float> out(size_t(counts[size_t(r)] + 1), -7.0f), again = out;
    Work first = ring->reduce_scatter_v(view(out), view(in), counts, ReduceOp::Sum, true);
    Work second = ring->reduce_scatter_v(view(again), view(in), counts, ReduceOp::Sum, true);
    second.wait();
    first.wait();
    mpi->all_reduce(view(reference));
    for (int64_t i = 0; i < counts[size_t(r)]; ++i) {
      ASSERT_NEAR(out[size_t(i)], reference[size_t(mine + i)], 1e-5f) << scale << " " << i;
      ASSERT_EQ(again[size_t(i)], out[size_t(i)]) << scale << " " << i;
    }
    EXPECT_EQ(out.back(), -7.0f);
    EXPECT_EQ(in, before);
  }
}

TEST_F(RingTest, OtherReductionsKeepTheBackendsAllReduce) {
  std::vector<float> m(3, float(r));
  ring->all_reduce(view(m), ReduceOp::Max);
  EXPECT_EQ(m[2], float(n - 1));
  std::vector<double> d(2, 1.0);
  ring->all_reduce(view_of(d.data(), Shape{2}, DType::F64));
  EXPECT_EQ(d[1], double(n));
}

}  // namespace
}  // namespace pentad::parallel
