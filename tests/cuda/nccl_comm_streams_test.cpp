// nccl_comm_test: the stream rule of parallel/comm.h on device tensors (kernels on the
// compute stream, communication on the communicator's own stream, ordered by events, the
// host free until a barrier) and pipeline rounds of transfers on one GPU (the program:
// nccl_comm_test.cpp; what both sources share: nccl_comm_test.h).
#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "core/device_memory.h"
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/pp/rounds.h"
#include "tests/cuda/nccl_comm_test.h"

namespace pentad::parallel::nccl_comm_test {
namespace {

// ---- the stream rule ----

class NcclStreams : public NcclComm {};

// Each repetition: a kernel writes `in`; an all-gather copies it into `out` on the
// communication stream; a kernel reads `out`. The next repetition's kernel overwrites
// `in` while the host has long moved on. Each of the four orderings (write in -> gather,
// gather -> read out, gather -> next write of in, read out -> next gather) is needed for
// the sums; the host never waits until the end, so it runs far ahead of the device.
TEST_F(NcclStreams, KernelsAndCollectivesStayOrderedWithoutTheHostWaiting) {
  // 64 MiB per f32 buffer: each kernel takes a while. Staged: 4 MiB, which every operation
  // moves through host memory (and the host waits for the kernels before each one anyway).
  const int64_t m = int64_t(1) << (tested_backend() == Backend::Staged ? 20 : 24);
  const int reps = 100;
  // Every copy from the host is made before the loop: one from pageable memory would
  // synchronize the compute stream and let the device catch up with the host.
  Tensor in = gpu.upload(std::vector<double>(size_t(m), double(r + 1)), DType::F32);
  Tensor out = gpu.alloc(m * n, DType::F32);
  Tensor acc = gpu.alloc(m * n, DType::F32), acc_reduced = gpu.alloc(m * n, DType::F32);
  device_zero(acc.data, acc.bytes());
  device_zero(acc_reduced.data, acc_reduced.bytes());
  comm->barrier();
  double factor_sum = 0;  // sum over repetitions of in's factor after its kernel
  double factor = 1;
  for (int rep = 0; rep < reps; ++rep) {
    const float s = rep % 2 == 0 ? 2.0f : 0.5f;  // in alternates 2(r+1), (r+1): exact
    kernels::scale(in, s);
    factor *= s;
    factor_sum += factor;
    if (rep % 3 == 0) {
      comm->all_gather(out, in);  // synchronous: still only a stream wait
    } else {
      Work w = comm->all_gather(out, in, /*async=*/true);
      w.wait();
    }
    kernels::add(acc, acc, out);
    // In place, after the kernel that read out: out = n × the gathered blocks.
    Work w = comm->all_reduce(out, ReduceOp::Sum, /*async=*/true);
    w.wait();
    kernels::add(acc_reduced, acc_reduced, out);
  }
  const std::vector<double> got = download(acc), got_reduced = download(acc_reduced);
  size_t bad = 0, first_bad = 0;
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < m; ++i) {
      const size_t at = size_t(q * m + i);
      const double want = (q + 1) * factor_sum;  // block q came from rank q
      if ((got[at] != want || got_reduced[at] != n * want) && bad++ == 0) first_bad = at;
    }
  EXPECT_EQ(bad, 0u) << "first wrong element " << first_bad << ": " << got[first_bad] << " and "
                     << got_reduced[first_bad] << ", wanted "
                     << (int64_t(first_bad) / m + 1) * factor_sum;
}

// wait() only queues a stream wait: right after it, with seconds of kernels still ahead
// on the device, the trace shows the operation pending; barrier() waits for all of it.
TEST_F(NcclStreams, WaitDoesNotBlockTheHostAndBarrierDoes) {
  const int64_t m = int64_t(1) << 26;  // 256 MiB
  Tensor x = gpu.alloc(m, DType::F32);
  device_zero(x.data, x.bytes());
  Tensor small = gpu.upload({double(r)}, DType::F32);  // before the kernels (see above)
  comm->barrier();
  for (int i = 0; i < 200; ++i) kernels::scale(x, 1.0f);  // ~0.2 ms each on an H100
  clear_comm_events();
  Work w = comm->all_reduce(small, ReduceOp::Sum, /*async=*/true);
  w.wait();
  std::vector<CommEvent> events = events_of("nccl");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].leave_ns, 0) << "wait() blocked the host until the device finished";
  comm->barrier();
  events = events_of("nccl");
  ASSERT_EQ(events.size(), 2u);
  EXPECT_GT(events[0].leave_ns, 0);
  EXPECT_EQ(download(small)[0], n * (n - 1) / 2.0);
}

// Pipeline transfers of device tensors in rounds (parallel/pp/rounds.h), on one GPU. Two
// real stages need two GPUs (NCCL refuses two ranks on one device), so this rank plays both
// stages of 1F1B over 4 micro-batches (and the two chunks per stage of interleaved 1F1B):
// each round, the passes of that round as kernels (a forward adds its virtual stage + 1 to
// its input; a backward doubles the gradient it gets, the last one starts from 1), then one
// group with every transfer of the round, sent to and received from itself, no host wait
// in between. What arrives is what the schedule implies: micro-batch k leaves the last
// virtual stage as k + 1 + (1 + 2 + ... + V), and virtual stage 0 gets 2^V. Every buffer is
// allocated before the rounds (allocating waits), so the host must not wait at all.
// tests/pp/rounds_test.cpp checks the order of every schedule against NCCL's semantics;
// tests/parallel/pipeline_stage_test.cpp runs the executor's rounds over MPI.
TEST_F(NcclComm, PipelineRoundsMoveDeviceTensorsOnOneGpu) {
  if (n != 1) GTEST_SKIP() << "plays every stage on one rank";
  using pp::Action;
  for (const pp::ScheduleSpec& spec :
       {pp::ScheduleSpec{pp::ScheduleKind::OneFOneB, 2, 4, 1, 1},
        pp::ScheduleSpec{pp::ScheduleKind::Interleaved, 2, 4, 2, 1}}) {
    const int p = spec.stages, v = spec.virtual_stages, V = p * v, m = spec.micro_batches;
    std::vector<std::vector<Action>> lists;
    std::vector<pp::RoundPlan> plans;
    for (int s = 0; s < p; ++s) lists.push_back(pp::stage_actions(spec, s));
    for (int s = 0; s < p; ++s) plans.push_back(pp::plan_rounds(lists, spec.placement(), s));
    const int64_t width = 1000;
    // Every value the emulation touches: inputs, outputs and arrivals, keyed by transfer.
    std::map<std::tuple<int, int, int>, Tensor> arrived;  // (type, micro, to vs)
    std::map<std::tuple<int, int, int>, Tensor> produced;
    std::vector<Tensor> adds;  // vs + 1, per virtual stage
    for (int vs = 0; vs < V; ++vs)
      adds.push_back(gpu.upload(std::vector<double>(width, vs + 1.0), DType::F32));
    std::vector<Tensor> inputs, final_out(static_cast<size_t>(m)),
        first_grads(static_cast<size_t>(m));
    for (int k = 0; k < m; ++k)
      inputs.push_back(gpu.upload(std::vector<double>(width, k + 1.0), DType::F32));
    const Tensor one = gpu.upload(std::vector<double>(width, 1.0), DType::F32);
    std::vector<std::vector<Tensor>> outs(static_cast<size_t>(p));
    for (int s = 0; s < p; ++s)
      for (size_t i = 0; i < lists[size_t(s)].size(); ++i)
        outs[size_t(s)].push_back(gpu.alloc(width, DType::F32));
    size_t rounds = 0;
    for (const pp::RoundPlan& plan : plans) {
      rounds = std::max(rounds, plan.groups.size());
      for (const auto& group : plan.groups)
        for (const pp::Transfer& t : group)
          if (!arrived.count({int(t.type), t.micro, t.to_virtual_stage}))
            arrived[{int(t.type), t.micro, t.to_virtual_stage}] = gpu.alloc(width, DType::F32);
    }
    const int64_t waits = device_waits();
    for (size_t round = 0; round < rounds; ++round) {
      for (int s = 0; s < p; ++s)
        for (size_t i = 0; i < lists[size_t(s)].size(); ++i) {
          if (plans[size_t(s)].round_of_action[i] != int(round)) continue;
          const Action& a = lists[size_t(s)][i];
          const int vs = a.chunk * p + s;
          const Tensor out = outs[size_t(s)][i];
          if (a.type == Action::Forward) {
            const Tensor in = vs == 0 ? inputs[size_t(a.micro)] : arrived.at({0, a.micro, vs});
            kernels::add(out, in, adds[size_t(vs)]);
            if (vs == V - 1)
              final_out[size_t(a.micro)] = out;
            else
              produced[{0, a.micro, vs + 1}] = out;
          } else {
            const Tensor g = vs == V - 1 ? one : arrived.at({1, a.micro, vs});
            kernels::add(out, g, g);
            if (vs == 0)
              first_grads[size_t(a.micro)] = out;
            else
              produced[{1, a.micro, vs - 1}] = out;
          }
        }
      // The round's group: every transfer once (both stages list it), sent to this rank.
      std::vector<P2POp> ops;
      std::set<std::tuple<int, int, int>> seen;
      for (const pp::RoundPlan& plan : plans) {
        if (round >= plan.groups.size()) continue;
        for (const pp::Transfer& t : plan.groups[round]) {
          const std::tuple<int, int, int> key{int(t.type), t.micro, t.to_virtual_stage};
          if (!seen.insert(key).second) continue;
          ops.push_back({true, produced.at(key), 0, 0});
          ops.push_back({false, arrived.at(key), 0, 0});
        }
      }
      if (!ops.empty()) comm->batch_p2p(ops);  // Works dropped: waits on the device only
    }
    EXPECT_EQ(device_waits(), waits) << "the host waited during the rounds";
    for (int k = 0; k < m; ++k) {
      EXPECT_EQ(download(final_out[size_t(k)])[width - 1], k + 1 + V * (V + 1) / 2.0)
          << pp::schedule_name(spec.kind) << " micro-batch " << k;
      EXPECT_EQ(download(first_grads[size_t(k)])[0], double(1 << V))
          << pp::schedule_name(spec.kind) << " micro-batch " << k;
    }
  }
}

}  // namespace
}  // namespace pentad::parallel::nccl_comm_test
