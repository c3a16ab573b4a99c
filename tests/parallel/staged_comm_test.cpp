// The staged communicator (parallel/staged_comm.cpp) on host tensors, which take its whole
// path (staging blocks, downloads, the MPI communicator's hooks and rings, uploads on
// completion): every collective and point-to-point transfer, in every dtype it moves or
// reduces, at odd sizes and size 0, blocking and asynchronous, bitwise against the MPI
// backend on the same inputs (the same MPI operations or rings on the same bytes) and, with
// small integers, against the exact values. Runs on 2, 4 and 8 ranks; the rest of the
// staged backend (its rings, operations in flight, the trace, the choice of backend, a
// training run) is in staged_backend_test.cpp.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "parallel/comm.h"
#include "staged_comm_test_util.h"

namespace pentad::parallel {
namespace {

using namespace staged_comm_test_util;

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

}  // namespace
}  // namespace pentad::parallel
