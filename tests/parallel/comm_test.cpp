// The communicator (MPI backend) on every rank of MPI_COMM_WORLD: what each collective
// computes, in every dtype it reduces or moves, and the slowness it can be given (an injected
// delay or bandwidth, PENTAD_SIM_NODES's simulated nodes). Values are chosen so each expected
// result can be checked by hand: rank r contributes numbers like r*10 + i, and the closed
// forms are written next to each check. Point-to-point and the trace are in
// comm_trace_test.cpp, the refusals and the host/device routing in comm_routing_test.cpp.
#include "parallel/comm.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "comm_test_util.h"
#include "core/bf16.h"

namespace pentad::parallel {
namespace {

using namespace comm_test_util;

template <typename T>
void check_all_reduce(Communicator& comm, int r, int n) {
  const int k = 5;
  std::vector<T> sum(k), max(k), min(k);
  for (int i = 0; i < k; ++i) sum[size_t(i)] = max[size_t(i)] = min[size_t(i)] = T(r * 10 + i);
  comm.all_reduce(view(sum), ReduceOp::Sum);
  comm.all_reduce(view(max), ReduceOp::Max);
  comm.all_reduce(view(min), ReduceOp::Min);
  for (int i = 0; i < k; ++i) {
    EXPECT_EQ(sum[size_t(i)], T(10 * n * (n - 1) / 2 + n * i)) << i;  // sum_r (10r + i)
    EXPECT_EQ(max[size_t(i)], T(10 * (n - 1) + i)) << i;
    EXPECT_EQ(min[size_t(i)], T(i)) << i;
  }
}

TEST_F(CommTest, AllReduceSumMaxMinEveryDType) {
  check_all_reduce<float>(*comm, r, n);
  check_all_reduce<double>(*comm, r, n);
  check_all_reduce<int32_t>(*comm, r, n);
}

template <typename T>
void check_reduce_scatter(Communicator& comm, int r, int n) {
  const int k = 3;
  std::vector<T> in(static_cast<size_t>(n * k)), out(static_cast<size_t>(k), T(-1));
  for (int j = 0; j < n * k; ++j) in[size_t(j)] = T(r + j);
  comm.reduce_scatter(view(out), view(in));
  for (int i = 0; i < k; ++i)  // sum_q (q + r*k + i)
    EXPECT_EQ(out[size_t(i)], T(n * (n - 1) / 2 + n * (r * k + i))) << i;
  std::vector<T> max(static_cast<size_t>(k));
  comm.reduce_scatter(view(max), view(in), ReduceOp::Max);
  for (int i = 0; i < k; ++i) EXPECT_EQ(max[size_t(i)], T(n - 1 + r * k + i)) << i;
}

TEST_F(CommTest, ReduceScatterGivesRankItsBlock) {
  check_reduce_scatter<float>(*comm, r, n);
  check_reduce_scatter<double>(*comm, r, n);
  check_reduce_scatter<int32_t>(*comm, r, n);
}

// bf16 reductions on the host (MPI user ops over 16-bit words): each pair is added in f32
// and rounded to the nearest bf16, ties to even, like NCCL's bf16 sum.
TEST_F(CommTest, Bf16ReducesInF32RoundedToNearestEven) {
  auto bf16 = [](std::vector<uint16_t>& v) {
    return Tensor{v.data(), DType::BF16, Device::CPU, Shape{int64_t(v.size())}};
  };
  // Small integers: exact in bf16, so every order of the pairwise sums gives the same words.
  const int k = 3;
  std::vector<uint16_t> sum(k), max(k), min(k);
  for (int i = 0; i < k; ++i)
    sum[size_t(i)] = max[size_t(i)] = min[size_t(i)] = float_to_bf16(float(r * 4 - i));
  comm->all_reduce(bf16(sum), ReduceOp::Sum);
  comm->all_reduce(bf16(max), ReduceOp::Max);
  comm->all_reduce(bf16(min), ReduceOp::Min);
  for (int i = 0; i < k; ++i) {
    EXPECT_EQ(bf16_to_float(sum[size_t(i)]), float(2 * n * (n - 1) - n * i)) << i;
    EXPECT_EQ(bf16_to_float(max[size_t(i)]), float(4 * (n - 1) - i)) << i;
    EXPECT_EQ(bf16_to_float(min[size_t(i)]), float(-i)) << i;
  }
  // Rounding: rank 0 adds 1, rank 1 adds 2^-8 or 3 * 2^-8, every other rank 0, so every
  // partial sum is exact but the last: 1 + 2^-8 is the tie between 1 and 1 + 2^-7 (to the
  // even 1), 1 + 3 * 2^-8 the tie between 1 + 2^-7 and 1 + 2^-6 (to the even 1 + 2^-6). A
  // reduction that added in bf16 without rounding to even, or truncated, gets another word.
  std::vector<uint16_t> ties(2, float_to_bf16(0.0f));
  if (r == 0) ties = {float_to_bf16(1.0f), float_to_bf16(1.0f)};
  if (r == 1) ties = {float_to_bf16(1.0f / 256), float_to_bf16(3.0f / 256)};
  comm->all_reduce(bf16(ties));
  EXPECT_EQ(ties[0], 0x3f80);  // 1
  EXPECT_EQ(ties[1], 0x3f82);  // 1 + 2^-6
  // reduce_scatter: rank q's block j sums to n (q + j) * 2 over the ranks' 2 (q + j).
  std::vector<uint16_t> in(size_t(n * k)), out(size_t(k), 0xffff);
  for (int j = 0; j < n * k; ++j) in[size_t(j)] = float_to_bf16(float(2 * j));
  comm->reduce_scatter(bf16(out), bf16(in));
  for (int i = 0; i < k; ++i) EXPECT_EQ(bf16_to_float(out[size_t(i)]), float(2 * n * (r * k + i)));
  // u16 words are moved, never added.
  std::vector<uint16_t> words(2);
  try {
    comm->all_reduce(Tensor{words.data(), DType::U16, Device::CPU, Shape{2}});
    ADD_FAILURE() << "an MPI u16 reduction ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not u16"), std::string::npos) << e.what();
  }
}

// Uneven blocks (rank q holds q + 1 elements, rank 1 none when there are more than two):
// reduce_scatter_v sums block r into rank r; all_gather_v puts every block in place.
TEST_F(CommTest, UnevenReduceScatterAndAllGather) {
  std::vector<int64_t> counts(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) counts[size_t(q)] = (n > 2 && q == 1) ? 0 : q + 1;
  int64_t total = 0, mine = 0;
  for (int q = 0; q < n; ++q) {
    if (q == r) mine = total;
    total += counts[size_t(q)];
  }
  std::vector<float> in(static_cast<size_t>(total)),
      out(static_cast<size_t>(counts[size_t(r)] + 1), -1.0f);
  for (int64_t j = 0; j < total; ++j) in[size_t(j)] = float(r * 1000 + j);
  comm->reduce_scatter_v(view(out), view(in), counts);
  for (int64_t i = 0; i < counts[size_t(r)]; ++i)  // sum_q (q * 1000 + mine + i)
    EXPECT_EQ(out[size_t(i)], float(1000 * n * (n - 1) / 2 + n * (mine + i))) << i;
  EXPECT_EQ(out.back(), -1.0f);  // nothing past this rank's block

  std::vector<double> buf(static_cast<size_t>(total), -1.0);
  for (int64_t i = 0; i < counts[size_t(r)]; ++i) buf[size_t(mine + i)] = r + 0.25 * double(i);
  comm->all_gather_v(view(buf), counts);
  int64_t at = 0;
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < counts[size_t(q)]; ++i, ++at)
      EXPECT_EQ(buf[size_t(at)], q + 0.25 * double(i)) << q << " " << i;
  std::vector<int64_t> short_counts(static_cast<size_t>(n), 1);
  EXPECT_ANY_THROW(comm->all_gather_v(view(buf), short_counts));  // sizes disagree: refused
}

TEST_F(CommTest, AllGatherConcatenatesInRankOrder) {
  const int k = 4;
  std::vector<int32_t> in(k), out(static_cast<size_t>(n * k), -1);
  for (int i = 0; i < k; ++i) in[size_t(i)] = r * 100 + i;
  comm->all_gather(view(out), view(in));
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < k; ++i) EXPECT_EQ(out[size_t(q * k + i)], q * 100 + i);

  std::vector<double> one{double(r) + 0.5}, all(static_cast<size_t>(n));
  comm->all_gather(view(all), view(one));
  for (int q = 0; q < n; ++q) EXPECT_EQ(all[size_t(q)], q + 0.5);
}

TEST_F(CommTest, AllToAllTransposesBlocks) {
  const int k = 2;
  std::vector<float> in(static_cast<size_t>(n * k)), out(static_cast<size_t>(n * k), -1.0f);
  for (int p = 0; p < n; ++p)  // block p goes to rank p
    for (int i = 0; i < k; ++i) in[size_t(p * k + i)] = float(r * 1000 + p * 10 + i);
  comm->all_to_all(view(out), view(in));
  for (int q = 0; q < n; ++q)  // block q came from rank q
    for (int i = 0; i < k; ++i) EXPECT_EQ(out[size_t(q * k + i)], float(q * 1000 + r * 10 + i));
}

TEST_F(CommTest, AllToAllVUnevenWithZeroCounts) {
  // Rank r sends (r + p) % 3 elements to rank p: some pairs send nothing, the counts are
  // symmetric so rank r receives (q + r) % 3 from q. Buffers are longer than the counts;
  // the tail must stay untouched.
  std::vector<int64_t> send_counts(static_cast<size_t>(n)), recv_counts(static_cast<size_t>(n));
  int64_t send_total = 0, recv_total = 0;
  for (int p = 0; p < n; ++p) {
    send_counts[size_t(p)] = (r + p) % 3;
    recv_counts[size_t(p)] = (p + r) % 3;
    send_total += send_counts[size_t(p)];
    recv_total += recv_counts[size_t(p)];
  }
  std::vector<int32_t> in(static_cast<size_t>(send_total + 2), -7),
      out(static_cast<size_t>(recv_total + 3), -1);
  size_t at = 0;
  for (int p = 0; p < n; ++p)
    for (int64_t j = 0; j < send_counts[size_t(p)]; ++j) in[at++] = int32_t(r * 1000 + p * 10 + j);
  comm->all_to_all_v(view(out), recv_counts, view(in), send_counts);
  at = 0;
  for (int q = 0; q < n; ++q)
    for (int64_t j = 0; j < recv_counts[size_t(q)]; ++j)
      EXPECT_EQ(out[at++], int32_t(q * 1000 + r * 10 + j)) << "from " << q;
  for (; at < out.size(); ++at) EXPECT_EQ(out[at], -1) << "tail written at " << at;

  // All zero: legal, and nothing moves.
  std::vector<int64_t> zeros(static_cast<size_t>(n), 0);
  comm->all_to_all_v(view(out), zeros, view(in), zeros);
}

TEST_F(CommTest, BroadcastFromNonZeroRoot) {
  const int root = n - 1;
  std::vector<double> buf(6, 0.0);
  if (r == root)
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = 0.25 * double(i) + 3;
  comm->broadcast(view(buf), root);
  for (size_t i = 0; i < buf.size(); ++i) EXPECT_EQ(buf[i], 0.25 * double(i) + 3);
}

TEST_F(CommTest, InjectedDelaySlowsOnlyTheSlowRank) {
  const double delay = 0.15;
  auto slow = make_communicator(Backend::MPI, MPI_COMM_WORLD, "slow_link");
  slow->set_injection(Injection{delay, /*slow_rank=*/1, 0});
  std::vector<float> x(4, 1.0f);
  slow->barrier();
  slow->all_reduce(view(x));
  const std::vector<CommEvent> events = events_of("slow_link");
  ASSERT_FALSE(events.empty());
  // The slow rank spends the delay inside its operation; the others spend it waiting for
  // the slow rank (what slow-rank detection reads; a third leaves room for scheduling).
  if (r == 1)
    EXPECT_GE(events.back().seconds(), delay);
  else
    EXPECT_GE(events.back().seconds(), delay / 3);
  EXPECT_EQ(x[0], float(n));

  // Bandwidth: 4 KiB at 40 KiB/s adds 0.1 s on every rank.
  std::vector<float> big(1024, 1.0f);
  slow->set_injection(Injection{0, -1, 40.0 * 1024});
  slow->all_reduce(view(big));
  EXPECT_GE(events_of("slow_link").back().seconds(), 0.1);
  slow->set_injection(Injection{});
}

// PENTAD_SIM_NODES on 4 ranks as two nodes of two ({0, 1}, {2, 3}), 40 ms between them: a
// group inside a node runs at full speed, a group across them is slowed on every rank by the
// ring model (comm_injection.cpp) as wire time that an asynchronous collective spends behind
// the caller, and a send between nodes is delivered 40 ms late.
TEST_F(CommTest, SimulatedNodesSlowOnlyWhatCrossesNodes) {
  if (n != 4) GTEST_SKIP() << "needs 4 ranks";
  const double lat = 0.04;
  setenv("PENTAD_SIM_NODES", "2:40000:1", 1);
  const auto group = [&](int color, const char* name) {
    MPI_Comm part = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, color, r, &part);
    auto made = make_communicator(Backend::MPI, part, name);
    MPI_Comm_free(&part);
    return made;
  };
  auto inside = group(r / 2, "sim_inside");  // {0, 1}, {2, 3}
  auto across = group(r % 2, "sim_across");  // {0, 2}, {1, 3}: world ranks on two nodes
  unsetenv("PENTAD_SIM_NODES");
  const auto seconds = [](const std::function<void()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<float> x(4), all(8);
  const auto reset = [&] { std::fill(x.begin(), x.end(), float(r)); };
  // The fastest of three inside a node: well under one simulated latency.
  double inside_s = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    reset();
    inside_s = std::min(inside_s, seconds([&] { inside->all_reduce(view(x)); }));
    EXPECT_EQ(x[0], float(r / 2 * 4 + 1));  // {0, 1}: 1, {2, 3}: 5
  }
  EXPECT_LT(inside_s, lat);
  // Across: all_reduce of p = 2 is 2 steps of latency + bytes / 2 / 1 GB/s; all_gather 1.
  reset();
  EXPECT_GE(seconds([&] { across->all_reduce(view(x)); }), 2 * lat);
  EXPECT_EQ(x[0], float(2 * (r % 2) + 2));  // {0, 2}: 2, {1, 3}: 4
  EXPECT_GE(seconds([&] { across->all_gather(view(all), view(x)); }), lat);
  // Asynchronous collectives are posted at once, their wire time passing behind the caller,
  // and complete no sooner than it has; the link carries one at a time, so a second one
  // posted behind the first completes a whole wire time after it.
  reset();
  std::vector<float> y(4, float(r));
  const auto t0 = std::chrono::steady_clock::now();
  Work reduce = across->all_reduce(view(x), ReduceOp::Sum, true);
  Work gather = across->all_gather(view(all), view(y), true);
  const double posted_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(posted_s, lat);
  reduce.wait();
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2 * lat);
  gather.wait();
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3 * lat);
  EXPECT_EQ(x[0], float(2 * (r % 2) + 2));
  // A send between nodes arrives late; the receive waits for it.
  const int peer = 1 - across->rank();
  reset();
  const double send_s = seconds([&] {
    if (across->rank() == 0)
      across->send(view(x), peer);
    else
      across->recv(view(x), peer);
  });
  EXPECT_GE(send_s, across->rank() == 0 ? lat : 0.5 * lat);
  EXPECT_EQ(x[0], float(r % 2));  // the sender's value: world rank 0 or 1
}

}  // namespace
}  // namespace pentad::parallel
