// Ring attention (parallel/cp): how much of the K/V transfer time hides behind the blocks'
// attention. Run under mpirun, one ring rank per process (bench/cp_bench.sh):
//
//   mpirun -np R pentad_cp_bench T H HKV D [iters=5] [batch=1] [threads=1] [link_mib_s=0]
//
// On each rank, with random q, k, v, dout of its T/R tokens, it times (median over `iters`
// after one warm-up, the six measurements taking turns; each run starts at a barrier and
// counts the slowest rank):
//   total     ContextParallel::forward, and forward + backward, as the trainer calls them;
//   compute   the same kernels with no communication: per ring step the block's
//             attention_forward (+ attention_merge), or attention_backward into a zeroed
//             partial (+ the add of the incoming partial), with the same positions;
//   transfer  the same sends and receives, same sizes, tags and order, with no compute
//             (forward: R-1 K/V hops; backward: R-1 K/V hops and R dK/dV hops).
// hidden = (compute + transfer - total) / transfer, clipped to [0, 1]: 1 when the transfers
// cost nothing on top of the compute, 0 when they add their whole time.
// The forward's ring_compute_spans() are printed too: the blocks' attention time inside
// the overlapped run, against the compute alone.
//
// link_mib_s > 0 simulates a slow outgoing link of that many MiB/s on every rank (the
// communicator's Injection, links_only: a send is delivered bytes / rate after it is posted,
// without blocking the sender). It makes the transfers comparable to the compute, which on
// one machine's shared memory they are not, so that the schedule's overlap shows.
#include "parallel/cp/context_parallel.h"

#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "kernels/ops.h"

using namespace pentad;
using namespace pentad::parallel;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Medians over `iters` repetitions (after one warm-up) of the slowest rank's time of each of
// fs. The functions take turns within each repetition (A B C A B C ...), so that the shared
// machine's noise falls on all of them; each run starts together at a barrier.
std::vector<double> medians_slowest(Communicator& comm, int iters,
                                    const std::vector<std::function<void()>>& fs) {
  std::vector<std::vector<double>> s(fs.size());
  for (int i = 0; i <= iters; ++i)
    for (size_t j = 0; j < fs.size(); ++j) {
      comm.barrier();
      const double t0 = now();
      fs[j]();
      double mine = now() - t0, slowest = 0;
      MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (i > 0) s[j].push_back(slowest);
    }
  std::vector<double> out;
  for (auto& v : s) {
    std::sort(v.begin(), v.end());
    out.push_back(v[v.size() / 2]);
  }
  return out;
}

std::vector<float> random_values(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

double hidden(double compute, double transfer, double total) {
  return std::clamp((compute + transfer - total) / transfer, 0.0, 1.0);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  if (argc < 5) {
    std::fprintf(stderr,
                 "usage: mpirun -np R %s T H HKV D [iters=5] [batch=1] [threads=1] "
                 "[link_mib_s=0]\n",
                 argv[0]);
    MPI_Finalize();
    return 2;
  }
  const int64_t T = std::atol(argv[1]), H = std::atol(argv[2]), Hkv = std::atol(argv[3]),
                D = std::atol(argv[4]);
  const int iters = argc > 5 ? std::atoi(argv[5]) : 5;
  const int64_t B = argc > 6 ? std::atol(argv[6]) : 1;
  omp_set_num_threads(argc > 7 ? std::atoi(argv[7]) : 1);
  const double link_mib_s = argc > 8 ? std::atof(argv[8]) : 0.0;
  int ok = 0;
  {
    auto ring = make_communicator(Backend::MPI, MPI_COMM_WORLD, "cp");
    if (link_mib_s > 0)
      ring->set_injection(Injection{0.0, -1, link_mib_s * (1 << 20), /*links_only=*/true});
    const int R = ring->size(), r = ring->rank(), next = (r + 1) % R, prev = (r + R - 1) % R;
    ContextParallel cp(nullptr, ring.get(), ContextShape{B, T, H, Hkv, D}, DType::F32, Device::CPU);
    const int64_t t = cp.local_len();
    const Shape qs{B, t, H, D}, kvs{B, t, Hkv, D}, lses{B, H, t};
    std::vector<float> q = random_values(size_t(qs.numel()), 1 + unsigned(r)),
                       k = random_values(size_t(kvs.numel()), 11 + unsigned(r)),
                       v = random_values(size_t(kvs.numel()), 21 + unsigned(r)),
                       dout = random_values(size_t(qs.numel()), 31 + unsigned(r));
    std::vector<float> out(q.size()), lse(size_t(lses.numel())), dq(q.size()), dk(k.size()),
        dv(k.size()), block_out(q.size()), block_lse(lse.size());
    const Tensor qt = view_of(q.data(), qs), kt = view_of(k.data(), kvs),
                 vt = view_of(v.data(), kvs), doutt = view_of(dout.data(), qs),
                 outt = view_of(out.data(), qs), lset = view_of(lse.data(), lses),
                 dqt = view_of(dq.data(), qs), dkt = view_of(dk.data(), kvs),
                 dvt = view_of(dv.data(), kvs), bot = view_of(block_out.data(), qs),
                 blt = view_of(block_lse.data(), lses);
    std::vector<std::vector<int32_t>> pos;  // per ring rank: its zig-zag positions
    for (int i = 0; i < R; ++i) pos.push_back(context_positions(T, 1, R, 0, i));
    auto pos_t = [&](int i) { return view_of(pos[size_t(i)].data(), Shape{t}, DType::I32); };

    // (a) the overlapped forward and forward + backward.
    std::vector<ContextParallel::Span> spans;
    auto total_forward = [&] {
      cp.forward(outt, lset, qt, kt, vt);
      spans = cp.ring_compute_spans();
    };
    auto total_backward = [&] { cp.backward(dqt, dkt, dvt, doutt, qt, kt, vt, outt, lset); };

    // (b) the compute alone: every block's kernels on this rank's own K/V (the values do
    // not matter; the positions, and so the mask, are the real blocks').
    std::vector<float> partial(2 * k.size()), incoming(partial.size());
    const Tensor pt = view_of(partial.data(), Shape{int64_t(partial.size())}),
                 it = view_of(incoming.data(), pt.shape), pk = view_of(partial.data(), kvs),
                 pv = view_of(partial.data() + k.size(), kvs);
    auto compute_forward = [&] {
      for (int step = 0; step < R; ++step) {
        const int src = (r - step + R) % R;
        if (step == 0) {
          kernels::attention_forward(outt, lset, qt, kt, vt, pos_t(r), pos_t(src));
        } else {
          kernels::attention_forward(bot, blt, qt, kt, vt, pos_t(r), pos_t(src));
          kernels::attention_merge(outt, lset, bot, blt);
        }
      }
    };
    auto compute_backward = [&] {
      kernels::zero(dqt);
      for (int step = 0; step < R; ++step) {
        const int src = (r - step + R) % R;
        kernels::zero(pt);
        kernels::attention_backward(dqt, pk, pv, doutt, qt, kt, vt, outt, lset, pos_t(r),
                                    pos_t(src), true);
        if (step > 0) kernels::add(pt, pt, it);
      }
    };

    // (c) the transfers alone, as ring_forward and ring_backward post them.
    std::vector<float> kv0(partial.size()), kv1(partial.size()), dkv0(partial.size()),
        dkv1(partial.size());
    const Tensor kv[2] = {view_of(kv0.data(), pt.shape), view_of(kv1.data(), pt.shape)};
    const Tensor dkv[2] = {view_of(dkv0.data(), pt.shape), view_of(dkv1.data(), pt.shape)};
    constexpr int kTagKv = 11, kTagDkv = 12;
    auto transfer_forward = [&] {
      for (int step = 0; step + 1 < R; ++step) {
        Work recv = ring->recv(kv[(step + 1) % 2], prev, kTagKv, true);
        Work send = ring->send(kv[step % 2], next, kTagKv, true);
        recv.wait();
        send.wait();
      }
    };
    auto transfer_backward = [&] {
      Work dkv_send[2];
      for (int step = 0; step < R; ++step) {
        Work recv, send, dkv_recv;
        if (step + 1 < R) {
          recv = ring->recv(kv[(step + 1) % 2], prev, kTagKv, true);
          send = ring->send(kv[step % 2], next, kTagKv, true);
        }
        if (step > 0) dkv_recv = ring->recv(it, prev, kTagDkv, true);
        dkv_send[step % 2].wait();
        dkv_recv.wait();
        dkv_send[step % 2] = ring->send(dkv[step % 2], next, kTagDkv, true);
        recv.wait();
        send.wait();
      }
      ring->recv(it, prev, kTagDkv);
      for (Work& w : dkv_send) w.wait();
    };
    const std::vector<double> m = medians_slowest(*ring, iters,
                                                  {total_forward,
                                                   [&] {
                                                     total_forward();
                                                     total_backward();
                                                   },
                                                   compute_forward,
                                                   [&] {
                                                     compute_forward();
                                                     compute_backward();
                                                   },
                                                   transfer_forward,
                                                   [&] {
                                                     transfer_forward();
                                                     transfer_backward();
                                                   }});
    const double fwd_total = m[0], fb_total = m[1], fwd_compute = m[2], fb_compute = m[3],
                 fwd_transfer = m[4], fb_transfer = m[5];
    double span_sum = 0;
    for (const auto& sp : spans) span_sum += 1e-9 * double(sp.end_ns - sp.begin_ns);

    // Does a message move while the rank computes? One K/V hop posted, one block's attention,
    // then the waits timed: about the transfer alone if the message moved only inside wait()
    // (no progress without MPI calls), about 0 if it moved during the compute.
    std::vector<double> waits;
    for (int i = 0; i <= iters && link_mib_s == 0; ++i) {
      ring->barrier();
      Work recv = ring->recv(kv[1], prev, kTagKv, true);
      Work send = ring->send(kv[0], next, kTagKv, true);
      kernels::attention_forward(outt, lset, qt, kt, vt, pos_t(r), pos_t(r));
      const double t0 = now();
      recv.wait();
      send.wait();
      double mine = now() - t0, slowest = 0;
      MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (i > 0) waits.push_back(slowest);
    }
    std::sort(waits.begin(), waits.end());

    double spans_slowest = 0;
    MPI_Allreduce(&span_sum, &spans_slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r == 0) {
      const double block_mib = double(pt.bytes()) / (1 << 20);
      char rate[64] = "shared memory";
      if (link_mib_s > 0) std::snprintf(rate, sizeof rate, "%g MiB/s (simulated)", link_mib_s);
      std::printf(
          "ring %d ranks, B=%ld T=%ld H=%ld Hkv=%ld D=%ld: %ld tokens per rank, K/V "
          "block %.2f MiB, threads %d, median of %d, link %s\n",
          R, long(B), long(T), long(H), long(Hkv), long(D), long(t), block_mib,
          omp_get_max_threads(), iters, rate);
      std::printf("%-18s %10s %10s %10s %8s %8s\n", "pass", "total ms", "compute", "transfer",
                  "xfer/tot", "hidden");
      auto row = [](const char* name, double total, double compute, double transfer) {
        std::printf("%-18s %10.2f %10.2f %10.2f %7.1f%% %7.0f%%\n", name, total * 1e3,
                    compute * 1e3, transfer * 1e3, 100 * transfer / total,
                    100 * hidden(compute, transfer, total));
      };
      row("forward", fwd_total, fwd_compute, fwd_transfer);
      row("forward+backward", fb_total, fb_compute, fb_transfer);
      std::printf(
          "forward blocks' attention inside the overlapped run (ring_compute_spans, "
          "slowest rank): %.2f ms\n",
          spans_slowest * 1e3);
      if (!waits.empty())
        std::printf(
            "one K/V hop posted before one block's attention: wait() afterwards %.3f ms, "
            "the hop alone %.3f ms\n",
            waits[waits.size() / 2] * 1e3, fwd_transfer / (R - 1) * 1e3);
      std::printf("hidden_forward %.3f\nhidden_forward_backward %.3f\n",
                  hidden(fwd_compute, fwd_transfer, fwd_total),
                  hidden(fb_compute, fb_transfer, fb_total));
    }
    ok = 1;
  }
  MPI_Finalize();
  return ok ? 0 : 1;
}
