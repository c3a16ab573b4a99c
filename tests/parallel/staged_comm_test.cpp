// The staged communicator (parallel/staged_comm.cpp) on host tensors, which take its whole
// path (staging blocks, downloads, the MPI communicator's hooks and rings, uploads on
// completion): every collective and point-to-point transfer, in every dtype it moves or
// reduces, at odd sizes and size 0, blocking and asynchronous, bitwise against the MPI
// backend on the same inputs (the same MPI operations or rings on the same bytes) and, with
// small integers, against the exact values. Then the backend choice
// (parallel/backend_choice.h) on tables of ranks' places, and a training run on a mesh of
// staged communicators bitwise against the same run over MPI. Runs on 2, 4 and 8 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "launch/rank.h"
#include "parallel/backend_choice.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "parallel/trace.h"
#include "plan/layout.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

namespace pentad::parallel {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// A host tensor of n elements of dtype whose bytes live in `bytes`.
Tensor host(std::vector<char>& bytes, DType dtype, int64_t n) {
  bytes.assign(size_t(n) * dtype_bytes(dtype) + 1, '\0');  // + 1: never a null pointer
  return view_of(bytes.data(), Shape{n}, dtype, Device::CPU);
}

// Element i of rank r's input: a small integer (so sums of up to 8 ranks are exact in every
// dtype, bf16 included), negative for some, differing by rank and position.
double value(int r, int64_t i, int salt) {
  return double(((r + 1) * 7 + i * 3 + salt) % 23 - 11);
}

void fill(Tensor t, int r, int salt) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = value(r, i, salt);
    switch (t.dtype) {
      case DType::F32:
        t.f32()[i] = float(v);
        break;
      case DType::F64:
        static_cast<double*>(t.data)[i] = v;
        break;
      case DType::I32:
        static_cast<int32_t*>(t.data)[i] = int32_t(v);
        break;
      case DType::BF16:
        static_cast<uint16_t*>(t.data)[i] = float_to_bf16(float(v));
        break;
      case DType::U16:
        static_cast<uint16_t*>(t.data)[i] = uint16_t(v + 100);
        break;
    }
  }
}

double read(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32:
      return t.f32()[i];
    case DType::F64:
      return static_cast<const double*>(t.data)[i];
    case DType::I32:
      return static_cast<const int32_t*>(t.data)[i];
    case DType::BF16:
      return bf16_to_float(static_cast<const uint16_t*>(t.data)[i]);
    case DType::U16:
      return static_cast<const uint16_t*>(t.data)[i] - 100.0;
  }
  return 0;
}

double reduce(ReduceOp op, int64_t i, int n, int salt) {
  double acc = value(0, i, salt);
  for (int q = 1; q < n; ++q) {
    const double v = value(q, i, salt);
    acc = op == ReduceOp::Sum ? acc + v : op == ReduceOp::Max ? std::max(acc, v) : std::min(acc, v);
  }
  return acc;
}

// One case of run_everything: the communicator, the dtype, the element count k (per block),
// blocking or not; each check_* below runs its operations on it, checks the exact values and
// keeps every output's bytes, in order, for the bitwise comparison.
struct Case {
  Case(Communicator& comm, DType dtype, int64_t k, bool async)
      : comm(comm),
        dtype(dtype),
        k(k),
        async(async),
        r(comm.rank()),
        n(comm.size()),
        at(std::string(dtype_name(dtype)) + " k=" + std::to_string(k)) {}

  void keep(const Tensor& t) {
    const char* p = static_cast<const char*>(t.data);
    outputs.insert(outputs.end(), p, p + t.bytes());
  }
  void done(Work w) const { async ? w.wait() : void(); }

  Communicator& comm;
  const DType dtype;
  const int64_t k;
  const bool async;
  const int r, n;
  const std::string at;  // the case, for messages
  std::vector<char> outputs;
};

// all_reduce and reduce_scatter with every reduction.
void check_reductions(Case& c) {
  std::vector<char> a, b;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
    Tensor buf = host(a, c.dtype, c.k);
    fill(buf, c.r, 1);
    c.done(c.comm.all_reduce(buf, op, c.async));
    for (int64_t i = 0; i < c.k; ++i)
      EXPECT_EQ(read(buf, i), reduce(op, i, c.n, 1))
          << c.at << " all_reduce " << reduce_op_name(op);
    c.keep(buf);

    Tensor in = host(a, c.dtype, c.k * c.n), out = host(b, c.dtype, c.k);
    fill(in, c.r, 2);
    c.done(c.comm.reduce_scatter(out, in, op, c.async));
    for (int64_t i = 0; i < c.k; ++i)
      EXPECT_EQ(read(out, i), reduce(op, c.r * c.k + i, c.n, 2)) << c.at << " reduce_scatter";
    c.keep(out);
  }
}

// Uneven blocks: rank q's block has (k + q) % 3 + q elements (some 0 at small k); out is one
// element longer than this rank's block, and that element stays as it was.
void check_reduce_scatter_v(Case& c) {
  std::vector<int64_t> counts(static_cast<size_t>(c.n), 0);
  int64_t total = 0, first = 0;
  for (int q = 0; q < c.n; ++q) {
    counts[size_t(q)] = c.k == 0 ? 0 : (c.k + q) % 3 + q;
    if (q == c.r) first = total;
    total += counts[size_t(q)];
  }
  std::vector<char> a, b;
  const int64_t mine = counts[size_t(c.r)];
  Tensor in = host(a, c.dtype, total), out = host(b, c.dtype, mine + 1);
  fill(in, c.r, 3);
  fill(out, 99, 4);
  const double tail = read(out, mine);
  c.done(c.comm.reduce_scatter_v(out, in, counts, ReduceOp::Sum, c.async));
  for (int64_t i = 0; i < mine; ++i)
    EXPECT_EQ(read(out, i), reduce(ReduceOp::Sum, first + i, c.n, 3))
        << c.at << " reduce_scatter_v";
  EXPECT_EQ(read(out, mine), tail) << c.at << " reduce_scatter_v wrote past its block";
  c.keep(out);
}

void check_all_gather(Case& c) {
  std::vector<char> a, b;
  Tensor in = host(a, c.dtype, c.k), out = host(b, c.dtype, c.k * c.n);
  fill(in, c.r, 5);
  c.done(c.comm.all_gather(out, in, c.async));
  for (int q = 0; q < c.n; ++q)
    for (int64_t i = 0; i < c.k; ++i)
      EXPECT_EQ(read(out, q * c.k + i), value(q, i, 5)) << c.at << " all_gather";
  c.keep(out);
}

// all_gather_v, in place: rank q's block is q % 2 + k elements; the others' blocks are garbage
// before.
void check_all_gather_v(Case& c) {
  std::vector<int64_t> counts(static_cast<size_t>(c.n));
  int64_t total = 0, first = 0;
  for (int q = 0; q < c.n; ++q) {
    counts[size_t(q)] = c.k == 0 ? 0 : q % 2 + c.k;
    if (q == c.r) first = total;
    total += counts[size_t(q)];
  }
  std::vector<char> a, b;
  Tensor buf = host(a, c.dtype, total), mine = host(b, c.dtype, total);
  fill(buf, 50 + c.r, 6);
  fill(mine, c.r, 6);
  const size_t element = dtype_bytes(c.dtype);
  std::memcpy(static_cast<char*>(buf.data) + size_t(first) * element,
              static_cast<char*>(mine.data) + size_t(first) * element,
              size_t(counts[size_t(c.r)]) * element);
  c.done(c.comm.all_gather_v(buf, counts, c.async));
  int64_t e = 0;
  for (int q = 0; q < c.n; ++q)
    for (int64_t i = 0; i < counts[size_t(q)]; ++i, ++e)
      EXPECT_EQ(read(buf, e), value(q, e, 6)) << c.at << " all_gather_v from " << q;
  c.keep(buf);
}

void check_all_to_all(Case& c) {
  std::vector<char> a, b;
  Tensor in = host(a, c.dtype, c.k * c.n), out = host(b, c.dtype, c.k * c.n);
  fill(in, c.r, 7);
  c.done(c.comm.all_to_all(out, in, c.async));
  for (int q = 0; q < c.n; ++q)  // block q came from rank q, its block r
    for (int64_t i = 0; i < c.k; ++i)
      EXPECT_EQ(read(out, q * c.k + i), value(q, c.r * c.k + i, 7)) << c.at << " all_to_all";
  c.keep(out);
}

// all_to_all_v: rank r sends (r + p + k) % 3 elements to p; buffers longer than that.
void check_all_to_all_v(Case& c) {
  const int r = c.r, n = c.n;
  const int64_t k = c.k;
  std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  int64_t sent = 0, received = 0;
  for (int p = 0; p < n; ++p) {
    send[size_t(p)] = (r + p + k) % 3;
    recv[size_t(p)] = (p + r + k) % 3;
    sent += send[size_t(p)];
    received += recv[size_t(p)];
  }
  std::vector<char> a, b;
  Tensor in = host(a, c.dtype, sent + 2), out = host(b, c.dtype, received + 3);
  fill(in, r, 8);
  fill(out, 77, 9);
  const double tail = read(out, received);
  c.done(c.comm.all_to_all_v(out, recv, in, send, c.async));
  int64_t e = 0;
  for (int q = 0; q < n; ++q) {
    int64_t from = 0;  // where rank q's block for r starts in q's input
    for (int p = 0; p < r; ++p) from += (q + p + k) % 3;
    for (int64_t j = 0; j < recv[size_t(q)]; ++j, ++e)
      EXPECT_EQ(read(out, e), value(q, from + j, 8)) << c.at << " all_to_all_v from " << q;
  }
  EXPECT_EQ(read(out, received), tail) << c.at << " all_to_all_v wrote past the counts";
  c.keep(out);
}

// broadcast from the last rank.
void check_broadcast(Case& c) {
  std::vector<char> a;
  Tensor buf = host(a, c.dtype, c.k);
  fill(buf, c.r, 10);
  c.done(c.comm.broadcast(buf, c.n - 1, c.async));
  for (int64_t i = 0; i < c.k; ++i) EXPECT_EQ(read(buf, i), value(c.n - 1, i, 10)) << c.at;
  c.keep(buf);
}

// A ring exchange in one batch: each rank sends to its right neighbour, receives from its left.
void check_ring_exchange(Case& c) {
  const int right = (c.r + 1) % c.n, left = (c.r + c.n - 1) % c.n;
  std::vector<char> a, b;
  Tensor out = host(a, c.dtype, c.k + 1), in = host(b, c.dtype, c.k + 1);
  fill(out, c.r, 11);
  std::vector<Work> works =
      c.comm.batch_p2p({P2POp{true, out, right, 3}, P2POp{false, in, left, 3}});
  for (Work& w : works) w.wait();
  for (int64_t i = 0; i <= c.k; ++i) EXPECT_EQ(read(in, i), value(left, i, 11)) << c.at << " p2p";
  c.keep(in);
}

// Two messages to the right neighbour told apart by tag: the second posted first.
void check_tagged_pair(Case& c) {
  const int right = (c.r + 1) % c.n, left = (c.r + c.n - 1) % c.n;
  std::vector<char> a, b, d, e;
  Tensor one = host(a, c.dtype, c.k), two = host(b, c.dtype, c.k);
  fill(one, c.r, 12);
  fill(two, c.r, 13);
  Tensor got_one = host(d, c.dtype, c.k), got_two = host(e, c.dtype, c.k);
  Work r2 = c.comm.recv(got_two, left, 2, true);
  Work r1 = c.comm.recv(got_one, left, 1, true);
  Work s1 = c.comm.send(one, right, 1, true);
  Work s2 = c.comm.send(two, right, 2, true);
  r1.wait();
  r2.wait();
  s1.wait();
  s2.wait();
  for (int64_t i = 0; i < c.k; ++i) {
    EXPECT_EQ(read(got_one, i), value(left, i, 12)) << c.at << " tag 1";
    EXPECT_EQ(read(got_two, i), value(left, i, 13)) << c.at << " tag 2";
  }
  c.keep(got_one);
  c.keep(got_two);
}

// Every operation of the interface on `comm`, at element count k (per block), in `dtype`;
// returns every output's bytes, in order, for the bitwise comparison, and checks the exact
// values on the way.
std::vector<char> run_everything(Communicator& comm, DType dtype, int64_t k, bool async) {
  Case c(comm, dtype, k, async);
  if (dtype != DType::U16) {  // u16 moves but does not reduce
    check_reductions(c);
    check_reduce_scatter_v(c);
  }
  check_all_gather(c);
  check_all_gather_v(c);
  check_all_to_all(c);
  check_all_to_all_v(c);
  check_broadcast(c);
  check_ring_exchange(c);
  check_tagged_pair(c);
  comm.barrier();
  return std::move(c.outputs);
}

class StagedComm : public testing::Test {
 protected:
  void SetUp() override {
    if (world_size() < 2) GTEST_SKIP() << "run under mpirun with at least 2 ranks";
    staged = make_communicator(Backend::Staged, MPI_COMM_WORLD, "staged");
    mpi = make_communicator(Backend::MPI, MPI_COMM_WORLD, "mpi");
  }
  std::unique_ptr<Communicator> staged, mpi;
};

TEST_F(StagedComm, EveryOperationEveryDTypeMatchesMpiBitwise) {
  ASSERT_EQ(staged->backend(), Backend::Staged);
  EXPECT_STREQ(backend_name(staged->backend()), "staged");
  EXPECT_TRUE(backend_available(Backend::Staged));
  for (DType dtype : {DType::F32, DType::F64, DType::I32, DType::BF16, DType::U16})
    for (int64_t k : {0, 1, 7, 4099})
      for (bool async : {false, true}) {
        const std::vector<char> got = run_everything(*staged, dtype, k, async);
        const std::vector<char> want = run_everything(*mpi, dtype, k, async);
        EXPECT_TRUE(got == want) << dtype_name(dtype) << " k=" << k << " async=" << async
                                 << ": the staged backend's bytes differ from MPI's";
      }
}

// pentad's rings (the f32 sum all-reduce when asked for, every f32 sum reduce_scatter_v) run
// on the staged copies with the ring's fixed order: bitwise the MPI backend's rings, whose
// sums differ in the last bits from MPI's own all-reduce on these values.
TEST_F(StagedComm, RingsOnTheStagingMatchTheMpiBackendsRings) {
  staged->set_ring_all_reduce(true);
  mpi->set_ring_all_reduce(true);
  const int r = staged->rank(), n = staged->size();
  for (int64_t k : {1, 5, 1000, 70001}) {
    std::vector<float> x(static_cast<size_t>(k)), y;
    for (int64_t i = 0; i < k; ++i) x[size_t(i)] = 1.0f / float(1 + (i * 7 + r * 13) % 97);
    y = x;
    staged->all_reduce(view_of(x.data(), Shape{k}, DType::F32));
    mpi->all_reduce(view_of(y.data(), Shape{k}, DType::F32));
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float))) << "all_reduce " << k;

    std::vector<int64_t> counts(static_cast<size_t>(n), k);
    counts[0] = k / 2;
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    std::vector<float> in(static_cast<size_t>(total)), a(static_cast<size_t>(k), -1.0f),
        b(static_cast<size_t>(k), -1.0f);
    for (int64_t i = 0; i < total; ++i) in[size_t(i)] = 1.0f / float(1 + (i * 5 + r * 11) % 89);
    Work wa = staged->reduce_scatter_v(view_of(a.data(), Shape{k}, DType::F32),
                                       view_of(in.data(), Shape{total}, DType::F32), counts,
                                       ReduceOp::Sum, true);
    Work wb = mpi->reduce_scatter_v(view_of(b.data(), Shape{k}, DType::F32),
                                    view_of(in.data(), Shape{total}, DType::F32), counts,
                                    ReduceOp::Sum, true);
    wa.wait();
    wb.wait();
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
        << "reduce_scatter_v " << k;
  }
}

// Several operations in flight at once, each with its own staging block, completed out of
// order: test() drives them (no progress thread), and each lands in its own tensor. Then
// the blocks are reused: the same again gives the same.
TEST_F(StagedComm, OperationsInFlightTogetherCompleteOutOfOrder) {
  const int r = staged->rank(), n = staged->size();
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<float>> bufs(6, std::vector<float>(33));
    std::vector<Work> works;
    for (size_t j = 0; j < bufs.size(); ++j) {
      for (size_t i = 0; i < bufs[j].size(); ++i)
        bufs[j][i] = float(r + 1) * float(j + 1) + float(i);
      works.push_back(staged->all_reduce(view_of(bufs[j].data(), Shape{33}, DType::F32),
                                         j % 2 ? ReduceOp::Max : ReduceOp::Sum, true));
    }
    for (size_t j = works.size(); j-- > 0;) {
      while (!works[j].test()) {
      }
      EXPECT_TRUE(works[j].done());
    }
    for (size_t j = 0; j < bufs.size(); ++j)
      for (size_t i = 0; i < bufs[j].size(); ++i) {
        const float want = j % 2 ? float(n) * float(j + 1) + float(i)
                                 : float(n * (n + 1) / 2) * float(j + 1) + float(n) * float(i);
        ASSERT_EQ(bufs[j][i], want) << "round " << round << " op " << j << " element " << i;
      }
  }
}

// One trace event per operation, on the staged communicator's channel, with the interface's
// bytes; the MPI communicator inside records none of its own.
TEST_F(StagedComm, TraceHasOneEventPerOperation) {
  clear_comm_events();
  std::vector<float> x(10, 1.0f), g(size_t(10 * staged->size()));
  staged->all_reduce(view_of(x.data(), Shape{10}, DType::F32));
  staged->all_gather(view_of(g.data(), Shape{int64_t(g.size())}, DType::F32),
                     view_of(x.data(), Shape{10}, DType::F32));
  int events = 0;
  for (const CommEvent& e : comm_events()) {
    ASSERT_EQ(e.name(), "staged") << "an event on another channel: " << e.name();
    EXPECT_GT(e.leave_ns, 0) << "seq " << e.seq << " never seen complete";
    EXPECT_EQ(e.bytes, 40) << comm_kind_name(e.kind);
    EXPECT_EQ(e.seq, uint64_t(events));
    ++events;
  }
  EXPECT_EQ(events, 2);
}

TEST_F(StagedComm, RefusesToAddU16) {
  std::vector<uint16_t> words(4, 1);
  try {
    staged->all_reduce(view_of(words.data(), Shape{4}, DType::U16));
    FAIL() << "a u16 sum was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("staged backend reduces"), std::string::npos) << e.what();
  }
}

// ---- the choice of backend ----

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BackendChoice, CpuRunsTakeMpiUnlessStagedIsForced) {
  const std::vector<RankPlace> cpu(4, RankPlace{"node0", ""});
  EXPECT_EQ(choose_backend("auto", false, true, cpu).backend, Backend::MPI);
  EXPECT_EQ(choose_backend("auto", false, true, cpu).reason, "");  // nothing logged
  EXPECT_EQ(choose_backend("staged", false, true, cpu).backend, Backend::Staged);
  EXPECT_EQ(choose_backend("staged", false, false, cpu).backend, Backend::Staged);
  const std::string nccl = error_of([&] { choose_backend("nccl", false, true, cpu); });
  EXPECT_NE(nccl.find("parallel.comm_backend = \"nccl\" needs train.device = \"cuda\""),
            std::string::npos)
      << nccl;
  const std::string bad = error_of([&] { choose_backend("gloo", false, true, cpu); });
  EXPECT_NE(bad.find("parallel.comm_backend = \"gloo\""), std::string::npos) << bad;
  EXPECT_NE(bad.find("\"staged\""), std::string::npos) << bad;
}

TEST(BackendChoice, GpusSharedByTwoRanksTakeStagedAndSayWhich) {
  // (host, PCI bus id) per world rank -> backend with "auto", NCCL built.
  struct Row {
    std::vector<RankPlace> places;
    Backend want;
    std::string reason_has;
  };
  const std::vector<Row> table = {
      {{{"a", "0000:01:00.0"}, {"a", "0000:02:00.0"}}, Backend::NCCL, "a GPU of its own"},
      // The same bus id on two machines is two GPUs.
      {{{"a", "0000:01:00.0"}, {"b", "0000:01:00.0"}}, Backend::NCCL, "a GPU of its own"},
      {{{"a", "0000:01:00.0"}, {"a", "0000:01:00.0"}},
       Backend::Staged,
       "ranks 0 and 1 share GPU 0000:01:00.0 on a (NCCL takes one GPU per rank)"},
      // 8 ranks on one H200: the first pair named.
      {std::vector<RankPlace>(8, RankPlace{"h200", "0000:9a:00.0"}), Backend::Staged,
       "ranks 0 and 1 share GPU 0000:9a:00.0 on h200"},
      // Two machines of 2 GPUs, 3 ranks each: ranks 3 and 5 share b's first GPU.
      {{{"a", "0000:01:00.0"},
        {"a", "0000:02:00.0"},
        {"a", "0000:03:00.0"},
        {"b", "0000:01:00.0"},
        {"b", "0000:02:00.0"},
        {"b", "0000:01:00.0"}},
       Backend::Staged,
       "ranks 3 and 5 share GPU 0000:01:00.0 on b"},
      {{{"a", "0000:01:00.0"}}, Backend::NCCL, "a GPU of its own"},
  };
  for (size_t i = 0; i < table.size(); ++i) {
    const BackendChoice got = choose_backend("auto", true, true, table[i].places);
    EXPECT_EQ(got.backend, table[i].want) << "row " << i << ": " << got.reason;
    EXPECT_NE(got.reason.find(table[i].reason_has), std::string::npos)
        << "row " << i << ": " << got.reason;
  }
  const std::vector<RankPlace>& shared = table[2].places;
  const std::vector<RankPlace>& own = table[0].places;
  // Forced either way; NCCL refused where it cannot run, naming the key and the ranks.
  EXPECT_EQ(choose_backend("staged", true, true, own).backend, Backend::Staged);
  EXPECT_EQ(choose_backend("nccl", true, true, own).backend, Backend::NCCL);
  const std::string refused = error_of([&] { choose_backend("nccl", true, true, shared); });
  EXPECT_NE(refused.find("parallel.comm_backend = \"nccl\" but ranks 0 and 1 share GPU"),
            std::string::npos)
      << refused;
  // Without NCCL: staged, said so; "nccl" refused.
  const BackendChoice no_nccl = choose_backend("auto", true, false, own);
  EXPECT_EQ(no_nccl.backend, Backend::Staged);
  EXPECT_NE(no_nccl.reason.find("built without NCCL"), std::string::npos) << no_nccl.reason;
  EXPECT_NE(error_of([&] { choose_backend("nccl", true, false, own); }).find("without NCCL"),
            std::string::npos);
}

// The same over MPI: every rank's place gathered, the same answer on every rank.
TEST(BackendChoice, GatheredOverTheWorld) {
  if (world_size() < 2) GTEST_SKIP() << "run under mpirun with at least 2 ranks";
  const int r = world_rank();
  const Backend own = select_backend("auto", true, "gpu" + std::to_string(r), MPI_COMM_WORLD);
  EXPECT_EQ(own, backend_available(Backend::NCCL) ? Backend::NCCL : Backend::Staged);
  // Ranks 2q and 2q + 1 on one GPU: shared.
  EXPECT_EQ(select_backend("auto", true, "gpu" + std::to_string(r / 2), MPI_COMM_WORLD),
            Backend::Staged);
  // Only the last rank shares with the one before it (3 or more ranks): still staged, everywhere.
  const int n = world_size();
  const std::string last = "gpu" + std::to_string(r == n - 1 ? n - 2 : r);
  EXPECT_EQ(select_backend("auto", true, last, MPI_COMM_WORLD), Backend::Staged);
  EXPECT_EQ(select_backend("auto", false, "", MPI_COMM_WORLD), Backend::MPI);
}

// ---- training through staged communicators ----

// A tiny model trained 3 steps on a mesh of staged communicators (chosen as the executable
// chooses, from parallel.comm_backend) against the same layout over MPI: the same losses,
// bit for bit. Layout by world size: tp 2 with sequence parallelism, dp (ZeRO-1 at 4 ranks
// and more), pp 2 at 8.
std::vector<float> train_losses(const std::string& comm_backend) {
  const int n = world_size();
  std::vector<std::string> keys = {"model.n_layer=2",
                                   "model.d_model=64",
                                   "model.n_head=4",
                                   "model.vocab_size=256",
                                   "model.max_seq_len=32",
                                   "train.seq_len=32",
                                   "train.micro_batch=2",
                                   "train.grad_accum=2",
                                   "train.threads=1",
                                   "data.source=random",
                                   "train.eval_every=0",
                                   "parallel.tp=2",
                                   "parallel.sequence_parallel=true",
                                   "parallel.comm_backend=" + comm_backend};
  if (n >= 4) keys.push_back("parallel.zero=1");
  if (n >= 8) keys.push_back("parallel.pp=2");
  const Config cfg = parse_recipe("", "staged-layout-test", keys);
  const Backend backend = launch::start_rank(cfg);
  EXPECT_EQ(backend, comm_backend == "staged" ? Backend::Staged : Backend::MPI);
  Mesh mesh = Mesh::create(mesh_config(cfg, n), MPI_COMM_WORLD, backend);
  EXPECT_EQ(mesh.world().backend(), backend);
  Trainer trainer(cfg, &mesh);
  std::vector<float> losses;
  for (int64_t step = 0; step < 3; ++step) losses.push_back(trainer.train_step(step).loss);
  return losses;
}

TEST(StagedTraining, LayoutOverStagedCommunicatorsMatchesMpiBitwise) {
  if (world_size() < 2 || world_size() % 2) GTEST_SKIP() << "needs an even number of ranks";
  const std::vector<float> mpi = train_losses("auto");
  const std::vector<float> staged = train_losses("staged");
  ASSERT_EQ(staged.size(), mpi.size());
  for (size_t i = 0; i < staged.size(); ++i)
    EXPECT_EQ(0, std::memcmp(&staged[i], &mpi[i], sizeof(float)))
        << "step " << i + 1 << ": staged " << staged[i] << ", MPI " << mpi[i];
  EXPECT_TRUE(std::isfinite(staged.back()));
}

}  // namespace
}  // namespace pentad::parallel
