// The communicator (MPI backend) on every rank of MPI_COMM_WORLD: point-to-point transfers
// (tags, batches, large messages), non-blocking work (test, wait, moves), and the trace every
// operation leaves (sequence, bytes, peers and times, the ring of newest events, the dumps on
// a signal and on an MPI error).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "comm_test_util.h"
#include "parallel/comm.h"
#include "parallel/trace.h"

namespace pentad::parallel {
namespace {

using namespace comm_test_util;

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

// The ranks of one machine read one trace clock once aligned: each clock's zero on the steady
// clock is the same (before, each rank counted from its own start, milliseconds apart under
// mpirun, which the pipeline timeline read as transfers that long).
TEST_F(CommTest, RanksOfAMachineShareTheTraceClock) {
  align_trace_clock(MPI_COMM_WORLD);
  align_trace_clock(MPI_COMM_WORLD);  // once a process: a second call changes nothing
  // The trace clock's zero on the steady clock: the steady clock read first, so each reading
  // is the zero less the time between the two reads; the largest of several is the zero within
  // nanoseconds, even where the rank lost its core between the reads of one of them.
  const auto zero_ns = [] {
    int64_t zero = std::numeric_limits<int64_t>::min();
    for (int i = 0; i < 8; ++i) {
      const int64_t steady = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count();
      zero = std::max(zero, steady - trace_now_ns());
    }
    return zero;
  };
  const int64_t mine = zero_ns();
  std::vector<int64_t> zeros(static_cast<size_t>(n));
  MPI_Allgather(&mine, 1, MPI_INT64_T, zeros.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
  const auto [low, high] = std::minmax_element(zeros.begin(), zeros.end());
  EXPECT_LT(*high - *low, 1000000)
      << "the ranks' trace clocks start " << double(*high - *low) * 1e-6 << " ms apart";
  EXPECT_LT(std::abs(zero_ns() - mine), 1000000);  // the zero stays where it was set
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

}  // namespace
}  // namespace pentad::parallel
