// The communicator (MPI backend) and its trace, on every rank of MPI_COMM_WORLD; and the
// host/device routing every device backend shares, through a fake device backend.
// Values are chosen so each expected result can be checked by hand: rank r contributes
// numbers like r*10 + i, and the closed forms are written next to each check.
#include "parallel/comm.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "core/device_memory.h"
#include "parallel/backend.h"

namespace pentad::parallel {
namespace {

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::F64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::I32;
}

template <typename T>
Tensor view(std::vector<T>& v) {
  Tensor t;
  t.data = v.data();
  t.dtype = dtype_of<T>();
  t.shape = Shape{int64_t(v.size())};
  return t;
}

// Runs f with stderr sent to a temporary file; returns what was written.
template <typename F>
std::string capture_stderr(F&& f) {
  std::fflush(stderr);
  std::FILE* file = std::tmpfile();
  const int saved = dup(STDERR_FILENO);
  dup2(fileno(file), STDERR_FILENO);
  f();
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::string text;
  std::rewind(file);
  for (int ch = std::fgetc(file); ch != EOF; ch = std::fgetc(file)) text += char(ch);
  std::fclose(file);
  return text;
}

class CommTest : public testing::Test {
 protected:
  void SetUp() override {
    comm = make_communicator(Backend::MPI, MPI_COMM_WORLD, "test");
    r = comm->rank();
    n = comm->size();
    if (n < 2) GTEST_SKIP() << "run under mpirun with at least 2 ranks";
  }
  std::unique_ptr<Communicator> comm;
  int r = 0, n = 1;
};

// Newest events of communicator `name`, oldest first.
std::vector<CommEvent> events_of(const std::string& name) {
  std::vector<CommEvent> out;
  for (const CommEvent& e : comm_events())
    if (e.name() == name) out.push_back(e);
  return out;
}

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

TEST_F(CommTest, BlockingSendRecvPairsWithTags) {
  // Even ranks send to the next rank; two messages with different tags are received in
  // the opposite order of sending (tag matching, not arrival order).
  std::vector<float> a{float(r), 1}, b{float(r), 2};
  if (r % 2 == 0 && r + 1 < n) {
    Work first = comm->send(view(a), r + 1, /*tag=*/1, /*async=*/true);
    comm->send(view(b), r + 1, /*tag=*/2);
    first.wait();
  } else if (r % 2 == 1) {
    std::vector<float> got_b(2), got_a(2);
    comm->recv(view(got_b), r - 1, 2);
    comm->recv(view(got_a), r - 1, 1);
    EXPECT_EQ(got_a, (std::vector<float>{float(r - 1), 1}));
    EXPECT_EQ(got_b, (std::vector<float>{float(r - 1), 2}));
  }
}

TEST_F(CommTest, NonBlockingPostSeveralThenTestAndWait) {
  EXPECT_TRUE(Work().done());
  Work nothing;
  nothing.wait();
  EXPECT_TRUE(nothing.test());

  const int k = 1000;
  std::vector<float> a(k, float(r + 1)), b(k, 2.0f);
  std::vector<int32_t> mine{r}, all(static_cast<size_t>(n), -1);
  std::vector<Work> works;
  works.push_back(comm->all_reduce(view(a), ReduceOp::Sum, true));
  works.push_back(comm->all_reduce(view(b), ReduceOp::Max, true));
  works.push_back(comm->all_gather(view(all), view(mine), true));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  size_t done = 0;
  while (done < works.size() && std::chrono::steady_clock::now() < deadline) {
    done = 0;
    for (Work& w : works) done += w.test() ? 1 : 0;
  }
  ASSERT_EQ(done, works.size()) << "non-blocking operations did not finish in 30 s";
  for (Work& w : works) {
    EXPECT_TRUE(w.done());
    w.wait();  // again: a no-op
    w.wait();
  }
  EXPECT_EQ(a[0], float(n * (n + 1) / 2));
  EXPECT_EQ(a[k - 1], float(n * (n + 1) / 2));
  EXPECT_EQ(b[7], 2.0f);
  for (int q = 0; q < n; ++q) EXPECT_EQ(all[size_t(q)], q);

  // A moved Work carries the pending operation; the moved-from one is complete.
  std::vector<double> c{1.0};
  Work first = comm->all_reduce(view(c), ReduceOp::Sum, true);
  Work second = std::move(first);
  EXPECT_TRUE(first.done());  // NOLINT(bugprone-use-after-move): documented state
  second.wait();
  EXPECT_EQ(c[0], double(n));
}

TEST_F(CommTest, BatchedP2PRingExchangeOfLargeMessages) {
  // Every rank sends 4 MiB to its right neighbour and receives from its left; with
  // blocking sends in this order a rendezvous protocol would deadlock.
  const int k = 1 << 20;
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  std::vector<float> out(k), in(k, -1.0f);
  for (int i = 0; i < k; ++i) out[size_t(i)] = float(r) + float(i % 97);
  std::vector<P2POp> ops;
  ops.push_back(P2POp{true, view(out), right, 3});
  ops.push_back(P2POp{false, view(in), left, 3});
  std::vector<Work> works = comm->batch_p2p(std::move(ops));
  ASSERT_EQ(works.size(), 2u);
  for (Work& w : works) w.wait();
  EXPECT_EQ(in[0], float(left));
  EXPECT_EQ(in[size_t(k - 1)], float(left) + float((k - 1) % 97));
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

TEST_F(CommTest, TraceRecordsSequenceBytesPeersAndTimes) {
  clear_comm_events();
  auto alpha = make_communicator(Backend::MPI, MPI_COMM_WORLD, "alpha");
  auto beta = make_communicator(Backend::MPI, MPI_COMM_WORLD, "beta");
  std::vector<float> f(10, 1.0f);
  std::vector<double> d(3, 1.0), gathered(static_cast<size_t>(3 * n));
  alpha->all_reduce(view(f));                 // 40 bytes
  beta->all_gather(view(gathered), view(d));  // 24 bytes (this rank's part)
  alpha->broadcast(view(d), n - 1);           // 24 bytes, peer = root
  alpha->barrier();                           // 0 bytes
  beta->all_reduce(view(d));                  // 24 bytes

  std::vector<CommEvent> a = events_of("alpha"), b = events_of("beta");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_NE(a[0].comm_id, b[0].comm_id);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].seq, i);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i].seq, i);
  EXPECT_EQ(a[0].kind, CommKind::AllReduce);
  EXPECT_EQ(a[0].bytes, 40);
  EXPECT_EQ(a[0].peer, -1);
  EXPECT_EQ(a[1].kind, CommKind::Broadcast);
  EXPECT_EQ(a[1].bytes, 24);
  EXPECT_EQ(a[1].peer, n - 1);
  EXPECT_EQ(a[2].kind, CommKind::Barrier);
  EXPECT_EQ(a[2].bytes, 0);
  EXPECT_EQ(b[0].kind, CommKind::AllGather);
  EXPECT_EQ(b[0].bytes, 24);
  for (const CommEvent& e : comm_events()) {
    EXPECT_GT(e.enter_ns, 0);
    EXPECT_GE(e.leave_ns, e.enter_ns);
  }
  const std::vector<CommEvent> all = comm_events();
  for (size_t i = 1; i < all.size(); ++i) EXPECT_EQ(all[i].id, all[i - 1].id + 1);

  // A pending operation has leave 0 until it is observed complete. Rank 0 posts a
  // receive that rank 1 only matches after the barrier.
  std::vector<int32_t> msg{0};
  if (r == 0) {
    Work pending = beta->recv(view(msg), 1, 9, /*async=*/true);
    EXPECT_EQ(events_of("beta").back().kind, CommKind::Recv);
    EXPECT_EQ(events_of("beta").back().peer, 1);
    EXPECT_EQ(events_of("beta").back().leave_ns, 0);
    alpha->barrier();
    pending.wait();
    EXPECT_EQ(msg[0], 42);
    EXPECT_GE(events_of("beta").back().leave_ns, events_of("beta").back().enter_ns);
    EXPECT_GT(events_of("beta").back().leave_ns, 0);
  } else {
    alpha->barrier();
    if (r == 1) {
      msg[0] = 42;
      beta->send(view(msg), 0, 9);
      EXPECT_EQ(events_of("beta").back().kind, CommKind::Send);
      EXPECT_EQ(events_of("beta").back().bytes, 4);
      EXPECT_EQ(events_of("beta").back().peer, 0);
    }
  }

  // Totals per name: alpha ran all_reduce, broadcast and two barriers.
  const CommTotals totals = comm_totals()["alpha"];
  EXPECT_EQ(totals.count, 4);
  EXPECT_EQ(totals.bytes, 64);
  EXPECT_GT(totals.seconds, 0.0);

  // The dump is one line per event plus a header.
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  dump_comm_events(file);
  std::rewind(file);
  int lines = 0;
  for (int ch = std::fgetc(file); ch != EOF; ch = std::fgetc(file)) lines += ch == '\n';
  std::fclose(file);
  EXPECT_EQ(lines, int(comm_events().size()) + 1);
}

TEST_F(CommTest, TraceRingKeepsTheNewestEvents) {
  // A one-rank communicator makes thousands of operations cheap.
  clear_comm_events();
  auto self = make_communicator(Backend::MPI, MPI_COMM_SELF, "self");
  std::vector<int32_t> x{1};
  const uint64_t total = kCommTraceCapacity + 100;
  for (uint64_t i = 0; i < total; ++i) self->all_reduce(view(x));
  const std::vector<CommEvent> events = comm_events();
  ASSERT_EQ(events.size(), kCommTraceCapacity);
  EXPECT_EQ(events.front().seq, 100u);  // the 100 oldest were overwritten
  EXPECT_EQ(events.back().seq, total - 1);
  for (size_t i = 1; i < events.size(); ++i) EXPECT_EQ(events[i].seq, events[i - 1].seq + 1);
  EXPECT_EQ(x[0], 1);
}

TEST_F(CommTest, RefusesWrongSizesAndDTypes) {
  std::vector<float> in(static_cast<size_t>(n * 2) + 1), out(2);
  try {
    comm->reduce_scatter(view(out), view(in));
    ADD_FAILURE() << "a reduce_scatter with the wrong input size ran";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_scatter: in (" + std::to_string(n * 2 + 1)),
              std::string::npos)
        << e.what();
  }
  std::vector<float> gathered(static_cast<size_t>(n));
  EXPECT_THROW(comm->all_gather(view(gathered), view(out)), std::logic_error);
  std::vector<int64_t> counts(static_cast<size_t>(n + 1), 0);
  EXPECT_THROW(comm->all_to_all_v(view(out), counts, view(in), counts), std::logic_error);
  EXPECT_THROW(comm->send(view(out), n, 0), std::logic_error);

  std::vector<uint16_t> u16(4);
  Tensor t{u16.data(), DType::U16, Device::CPU, Shape{4}};
  try {
    comm->all_reduce(t);
    ADD_FAILURE() << "an MPI u16 reduction ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not u16"), std::string::npos) << e.what();
  }
  // bf16 moves as raw 16-bit words: all_gather of them.
  std::vector<uint16_t> words{uint16_t(r)}, all(static_cast<size_t>(n));
  comm->all_gather(Tensor{all.data(), DType::BF16, Device::CPU, Shape{int64_t(n)}},
                   Tensor{words.data(), DType::BF16, Device::CPU, Shape{1}});
  for (int q = 0; q < n; ++q) EXPECT_EQ(all[size_t(q)], q);

  Tensor on_gpu = view(out);
  on_gpu.device = Device::CUDA;
  EXPECT_THROW(comm->all_reduce(on_gpu), std::logic_error);
}

TEST_F(CommTest, SignalDumpsTheTrace) {
  auto signalled = make_communicator(Backend::MPI, MPI_COMM_WORLD, "signalled");
  signalled->barrier();
  install_comm_dump_on_signal(SIGUSR2);
  const std::string text = capture_stderr([] { std::raise(SIGUSR2); });
  std::signal(SIGUSR2, SIG_DFL);
  EXPECT_NE(text.find("communication trace"), std::string::npos) << text;
  EXPECT_NE(text.find("signalled["), std::string::npos) << text;
  EXPECT_NE(text.find(" barrier "), std::string::npos) << text;
}

TEST_F(CommTest, MpiErrorDumpsTheTraceAndThrows) {
  // Rank 1 receives 4 elements into a 2-element buffer: MPI reports truncation.
  auto faulty = make_communicator(Backend::MPI, MPI_COMM_WORLD, "faulty");
  std::vector<int32_t> four{1, 2, 3, 4}, two(2);
  if (r == 0) faulty->send(view(four), 1, 5);
  if (r == 1) {
    std::string message;
    const std::string dumped = capture_stderr([&] {
      try {
        faulty->recv(view(two), 0, 5);
      } catch (const Error& e) {
        message = e.what();
      }
    });
    EXPECT_NE(message.find("MPI error in MPI_Irecv on communicator 'faulty'"), std::string::npos)
        << message;
    EXPECT_NE(dumped.find("faulty["), std::string::npos) << dumped;
    EXPECT_NE(dumped.find(" recv "), std::string::npos) << dumped;
  }
  faulty->barrier();
}

TEST_F(CommTest, MixedDevicesAreRefusedNamingTheCommunicatorAndOp) {
  std::vector<float> host(static_cast<size_t>(n)), one(1);
  Tensor device = view(host);
  device.device = Device::CUDA;  // never dereferenced: the check comes first
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"all_gather", [&] { comm->all_gather(device, view(one)); }},
      {"reduce_scatter", [&] { comm->reduce_scatter(view(one), device); }},
      {"all_to_all", [&] { comm->all_to_all(device, view(host)); }},
  };
  for (const auto& [op, call] : calls) {
    try {
      call();
      ADD_FAILURE() << op << " ran with one tensor on the host and one on the device";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("communicator 'test' " + op + ": in is on "),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("one device"), std::string::npos) << e.what();
    }
  }
}

// A device backend in name only: its "device" tensors are host memory labelled CUDA, and
// each of its hooks only logs that it was called. Host tensors must not reach it.
class FakeDeviceComm final : public Communicator {
 public:
  explicit FakeDeviceComm(MPI_Comm comm) : Communicator("fake", Backend::NCCL) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    set_host_companion(make_mpi_communicator(comm, name()));
  }
  // An operation the host has not seen finish after wait(): it keeps the trace ticket
  // until finish_all(), like an NCCL operation waiting on the device.
  class PendingWork final : public WorkImpl {
   public:
    explicit PendingWork(FakeDeviceComm& comm) : comm_(comm) {}
    bool test() override { return false; }
    void wait() override {}
    bool keep_ticket(const TraceTicket& ticket) override {
      comm_.kept.push_back(ticket);
      return true;
    }

   private:
    FakeDeviceComm& comm_;
  };
  void finish_all() {
    for (const TraceTicket& t : kept) trace_leave(t);
    kept.clear();
  }

  std::vector<std::string> log;
  std::vector<TraceTicket> kept;
  mutable int memory_checks = 0;

 protected:
  // The fake moves no data, so it takes every dtype (u16 reductions too, which MPI refuses).
  void check_dtype(DType, bool) const override {}
  void check_memory(const Tensor&, const char*, const char*) const override { ++memory_checks; }
  std::unique_ptr<WorkImpl> logged(const std::string& what) {
    log.push_back(what);
    return std::make_unique<PendingWork>(*this);
  }
  std::unique_ptr<WorkImpl> post_all_reduce(Tensor, ReduceOp) override {
    return logged("all_reduce");
  }
  std::unique_ptr<WorkImpl> post_reduce_scatter(Tensor, const Tensor&, ReduceOp) override {
    return logged("reduce_scatter");
  }
  std::unique_ptr<WorkImpl> post_all_gather(Tensor, const Tensor&) override {
    return logged("all_gather");
  }
  std::unique_ptr<WorkImpl> post_reduce_scatter_v(Tensor, const Tensor&, std::span<const int64_t>,
                                                  ReduceOp) override {
    return logged("reduce_scatter_v");
  }
  std::unique_ptr<WorkImpl> post_all_gather_v(Tensor, std::span<const int64_t>) override {
    return logged("all_gather_v");
  }
  std::unique_ptr<WorkImpl> post_all_to_all(Tensor, const Tensor&) override {
    return logged("all_to_all");
  }
  std::unique_ptr<WorkImpl> post_all_to_all_v(Tensor, std::span<const int64_t>, const Tensor&,
                                              std::span<const int64_t>) override {
    return logged("all_to_all_v");
  }
  std::unique_ptr<WorkImpl> post_broadcast(Tensor, int) override { return logged("broadcast"); }
  std::vector<std::unique_ptr<WorkImpl>> post_p2p(const std::vector<P2POp>& ops) override {
    std::vector<std::unique_ptr<WorkImpl>> works;
    for (const P2POp& op : ops) works.push_back(logged(op.is_send ? "send" : "recv"));
    return works;
  }
  std::unique_ptr<WorkImpl> post_barrier() override {
    log.push_back("barrier");
    return post_host_barrier();
  }
};

TEST_F(CommTest, DeviceBackendRoutesHostTensorsToItsMpiCompanion) {
  clear_comm_events();
  FakeDeviceComm fake(MPI_COMM_WORLD);
  ASSERT_EQ(fake.rank(), r);
  std::vector<double> loss{double(r) + 0.5};
  std::vector<int32_t> flag{r}, ids{r}, all(static_cast<size_t>(n), -1);
  std::vector<float> grads(4, 1.0f);
  Tensor device = view(grads);
  device.device = Device::CUDA;

  fake.all_reduce(view(loss));                 // seq 0, host: MPI
  fake.all_reduce(device);                     // seq 1, device
  fake.all_reduce(view(flag), ReduceOp::Max);  // seq 2, host
  fake.all_gather(view(all), view(ids));       // seq 3, host
  fake.broadcast(device, 0);                   // seq 4, device
  fake.barrier();                              // seq 5: the backend's, then the hosts'
  EXPECT_EQ(loss[0], double(n) * double(n - 1) / 2 + 0.5 * n);  // sum_r (r + 0.5)
  EXPECT_EQ(flag[0], n - 1);
  for (int q = 0; q < n; ++q) EXPECT_EQ(all[size_t(q)], q);
  EXPECT_EQ(grads[0], 1.0f);  // the fake backend does not move data
  EXPECT_EQ(fake.log, (std::vector<std::string>{"all_reduce", "broadcast", "barrier"}));
  EXPECT_EQ(fake.memory_checks, 6);  // every tensor of every operation

  // One channel, one sequence for both routes. The device operations were waited for but
  // not seen done: PENDING until the backend stamps them.
  std::vector<CommEvent> events = events_of("fake");
  ASSERT_EQ(events.size(), 6u);
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i].seq, i);
  for (const CommEvent& e : events) EXPECT_EQ(e.comm_id, events[0].comm_id);
  EXPECT_EQ(events[3].kind, CommKind::AllGather);
  EXPECT_EQ(events[5].kind, CommKind::Barrier);
  for (size_t i : {0u, 2u, 3u, 5u}) EXPECT_GT(events[i].leave_ns, 0) << i;
  for (size_t i : {1u, 4u}) EXPECT_EQ(events[i].leave_ns, 0) << i;
  fake.finish_all();
  events = events_of("fake");
  for (size_t i : {1u, 4u}) EXPECT_GE(events[i].leave_ns, events[i].enter_ns) << i;

  // Dtype rules follow the route: the fake device backend reduces u16 words, MPI does not.
  std::vector<uint16_t> u16(2);
  Tensor host_u16{u16.data(), DType::U16, Device::CPU, Shape{2}};
  Tensor device_u16{u16.data(), DType::U16, Device::CUDA, Shape{2}};
  fake.all_reduce(device_u16);
  try {
    fake.all_reduce(host_u16);
    ADD_FAILURE() << "a host u16 reduction reached MPI";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not u16"), std::string::npos) << e.what();
  }

  // A batch may mix: the host ops form one MPI batch (a ring exchange), the device op goes
  // to the backend, and each op keeps its own handle in order.
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  std::vector<int32_t> out{r * 7}, in{-1};
  std::vector<P2POp> ops{P2POp{true, view(out), right, 2}, P2POp{true, device, right, 0},
                         P2POp{false, view(in), left, 2}};
  std::vector<Work> works = fake.batch_p2p(std::move(ops));
  ASSERT_EQ(works.size(), 3u);
  works[0].wait();
  works[2].wait();
  EXPECT_EQ(in[0], left * 7);
  EXPECT_TRUE(works[0].done() && works[2].done());
  EXPECT_FALSE(works[1].test());  // the fake device never finishes by itself
  works[1].wait();
  EXPECT_EQ(fake.log.back(), "send");

  // Mixed devices within one operation: refused before anything is posted.
  const size_t logged = fake.log.size();
  std::vector<float> gathered(static_cast<size_t>(4 * n));
  Tensor device_gathered = view(gathered);
  device_gathered.device = Device::CUDA;
  try {
    fake.all_gather(device_gathered, view(grads));
    ADD_FAILURE() << "an all_gather from the host into the device ran";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("communicator 'fake' all_gather: in is on cpu but out "
                                         "is on cuda"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(fake.log.size(), logged);
  fake.finish_all();
  fake.barrier();
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

TEST_F(CommTest, NcclWithoutNcclIsAClearError) {
  if (backend_available(Backend::NCCL))
    GTEST_SKIP() << "this build has NCCL; creating one needs a GPU per rank";
  try {
    make_communicator(Backend::NCCL, MPI_COMM_WORLD, "nccl");
    ADD_FAILURE() << "made an NCCL communicator without NCCL";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("built without NCCL"), std::string::npos) << e.what();
  }
}

TEST_F(CommTest, NcclWithoutADeviceIsAClearError) {
  if (!backend_available(Backend::NCCL)) GTEST_SKIP() << "this build has no NCCL";
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU (tests/cuda tests NCCL)";
  try {
    make_communicator(Backend::NCCL, MPI_COMM_WORLD, "nccl");
    ADD_FAILURE() << "made an NCCL communicator without a device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'nccl': the NCCL backend needs a CUDA device"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pentad::parallel
