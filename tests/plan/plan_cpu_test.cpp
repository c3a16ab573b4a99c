// The planner on CPU nodes (plan/calibration.h, plan/cost_model.h): cores shared by the ranks
// oversubscribing them, pentad's ring moving only when polled, the kernel table's round trip
// and interpolation, the meter of other processes' CPU time that a calibration is timed
// against, and compute that follows the keys attention sees and a GEMM's rows.
#include <gtest/gtest.h>
#include <sched.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/blas_core.h"
#include "parallel/topology.h"
#include "plan/calibration.h"
#include "plan/cost_model.h"
#include "plan/layout.h"
#include "plan_test_util.h"
#include "recipe/recipe.h"

using namespace pentad;

namespace plan_test {

using pentad::plan_test_util::gpt;
using pentad::plan_test_util::nvswitch;
using pentad::plan_test_util::predict;

// A kernel table of a 2-core machine, one and two threads.
Calibration two_cores() {
  Calibration c;
  c.machine = "test";
  c.cores = 2;
  for (int t : {1, 2}) {
    KernelRates r;
    r.threads = t;
    r.gemm = {{1e6, 1e9 * t}, {1e9, 4e9 * t}};
    r.attention_flops_per_s = 2e9 * t;
    r.elementwise_bytes_per_s = 5e9;
    r.adamw_params_per_s = 1e8 * t;
    r.copy_bytes_per_s = 8e9;
    c.rates.push_back(r);
  }
  return c;
}

TEST(Plan, OversubscribedCpuCoresAreShared) {
  // 8 ranks on a 2-core node. A pipeline stage waiting for its input lends its cores to the
  // stage computing, so pp2's bubble nearly vanishes, which on GPUs it does not.
  const Cluster cpu = this_machine(two_cores(), 8);
  const std::vector<std::string> on_cpu = {"train.device=\"cpu\"", "train.precision=\"fp32\""};
  auto with = [&](std::vector<std::string> keys) {
    keys.insert(keys.end(), on_cpu.begin(), on_cpu.end());
    return gpt(keys);
  };
  const Config pp = with({"parallel.pp=2", "parallel.dp=4"});
  const Prediction shared = predict_step(pp, mesh_config(pp, 8), cpu.machine, cpu.topology);
  const Prediction own = predict(gpt({"parallel.pp=2", "parallel.dp=4"}), nvswitch());
  // m 8, p 2: (p-1)/(m+p-1) = 11% of the stages' time idle; the head's stage, the busiest,
  // idles least (its share of the step: about 5%).
  EXPECT_GT(own.bubble / own.step_seconds, 0.03);
  EXPECT_LT(shared.bubble / shared.step_seconds, 0.1 * own.bubble / own.step_seconds);
  EXPECT_GT(shared.oversubscription, 1.0);
  // Shared memory is copied by the cores that compute: 2D tp's chunks hide nothing among the
  // ranks of one CPU node, while on GPUs (NCCL beside the GEMMs) they hide 3/4 of it.
  const Config one = with({"parallel.tp=4", "parallel.tp_shape=\"2x2\"", "parallel.dp=2"});
  const Config four =
      with({"parallel.tp=4", "parallel.tp_shape=\"2x2\"", "parallel.dp=2", "parallel.tp_chunks=4"});
  const double cpu_one = predict_step(one, mesh_config(one, 8), cpu.machine, cpu.topology).tp;
  const double cpu_four = predict_step(four, mesh_config(four, 8), cpu.machine, cpu.topology).tp;
  EXPECT_GT(cpu_one, 0.0);
  EXPECT_DOUBLE_EQ(cpu_one, cpu_four);
  const double gpu_one =
      predict(gpt({"parallel.tp=4", "parallel.tp_shape=\"2x2\"", "parallel.dp=2"}), nvswitch()).tp;
  const double gpu_four = predict(gpt({"parallel.tp=4", "parallel.tp_shape=\"2x2\"",
                                       "parallel.dp=2", "parallel.tp_chunks=4"}),
                                  nvswitch())
                              .tp;
  EXPECT_LT(gpu_four, 0.5 * gpu_one);  // the loss's all-reduces over tp are not chunked
}

// Over two CPU nodes the gradient all-reduce is pentad's ring, which moves a leg only when
// backward polls it (4 times a layer): more is left after backward than of MPI's all-reduce,
// which the network moves behind backward; ZeRO-1's reduce-scatter (half the legs) is always
// pentad's ring. On one node nothing overlaps and the two are predicted alike.
TEST(Plan, CpuRingMovesOnlyWhenPolled) {
  const Cluster cpu = this_machine(two_cores(), 8);
  const parallel::Topology two_nodes = parallel::uniform_cluster(2, 4, 5, 5e-6, 0.2, 2e-4);
  auto dp_part = [&](const parallel::Topology& topo, std::vector<std::string> keys) {
    keys.insert(keys.end(), {"train.device=\"cpu\"", "train.precision=\"fp32\"", "parallel.dp=8"});
    const Config cfg = gpt(keys);
    return predict_step(cfg, mesh_config(cfg, 8), cpu.machine, topo).dp;
  };
  const double ring = dp_part(two_nodes, {});
  const double mpi = dp_part(two_nodes, {"parallel.ring_all_reduce=false"});
  EXPECT_GT(ring, 1.2 * mpi);
  EXPECT_DOUBLE_EQ(dp_part(two_nodes, {"parallel.zero=1"}),
                   dp_part(two_nodes, {"parallel.zero=1", "parallel.ring_all_reduce=false"}));
  EXPECT_DOUBLE_EQ(dp_part(cpu.topology, {}),
                   dp_part(cpu.topology, {"parallel.ring_all_reduce=false"}));
}

TEST(Plan, CalibrationRoundTripAndInterpolation) {
  Calibration c = two_cores();
  c.rates[0].attention_by_keys = {{64, 1e9}, {512, 4e9}};
  const std::string path = std::filesystem::temp_directory_path() / "pentad_plan_test_cal.json";
  c.write(path);
  const Calibration back = Calibration::read(path);
  std::filesystem::remove(path);
  ASSERT_EQ(back.rates.size(), 2u);
  EXPECT_DOUBLE_EQ(back.rates[1].gemm[1].second, 8e9);
  const KernelRates one = back.at_threads(1);
  EXPECT_DOUBLE_EQ(Calibration::gemm_seconds(one, 1e6), 1e-3);
  EXPECT_DOUBLE_EQ(Calibration::gemm_seconds(one, 1e9), 0.25);
  // Between two shapes the rate is interpolated in log(flops): halfway, the mean rate.
  EXPECT_NEAR(Calibration::gemm_seconds(one, std::sqrt(1e6 * 1e9)), std::sqrt(1e15) / 2.5e9, 1e-12);
  // Attention by the keys a call sees: clamped at the ends, interpolated in log(keys).
  ASSERT_EQ(one.attention_by_keys.size(), 2u);
  EXPECT_DOUBLE_EQ(Calibration::attention_seconds(one, 1e9, 32), 1.0);
  EXPECT_DOUBLE_EQ(Calibration::attention_seconds(one, 1e9, 4096), 0.25);
  EXPECT_NEAR(Calibration::attention_seconds(one, 1e9, std::sqrt(64.0 * 512)), 1 / 2.5, 1e-12);
  // A file without the table (older): the single rate throughout.
  EXPECT_DOUBLE_EQ(Calibration::attention_seconds(back.at_threads(2), 4e9, 64), 1.0);
  EXPECT_EQ(back.others_share(), 0.0);
  EXPECT_EQ(back.blas_core, "");
  c.rates[1].others_share = 0.375;  // kept, and the table's most is the file's
  c.blas_core = kernels::cpu::blas_core();
  c.write(path);
  EXPECT_DOUBLE_EQ(Calibration::read(path).others_share(), 0.375);
  EXPECT_EQ(Calibration::read(path).blas_core, c.blas_core);
  std::filesystem::remove(path);
}

// A file without its OpenBLAS kernels' name (older than that record) may hold the generic
// kernels' GEMM rates, several times too slow: read, it says so and how to time again; a file
// timed with this process's kernels says nothing.
TEST(Plan, CalibrationWithoutItsKernelsWarns) {
  if (kernels::cpu::blas_core().empty()) GTEST_SKIP() << "OpenBLAS does not name its kernels";
  const std::string path = std::filesystem::temp_directory_path() / "pentad_plan_test_core.json";
  std::ostringstream log;
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "plan_cpu_test", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  Calibration c = two_cores();
  c.machine = "";  // (no other machine's warning)
  c.write(path);
  Calibration::read(path);
  const std::string older = log.str();
  log.str("");
  c.blas_core = kernels::cpu::blas_core();
  c.write(path);
  Calibration::read(path);
  const std::string current = log.str();
  spdlog::set_default_logger(previous);
  std::filesystem::remove(path);
  EXPECT_NE(older.find("does not say which OpenBLAS kernels"), std::string::npos) << older;
  EXPECT_NE(older.find("rerun `pentad plan --calibrate`"), std::string::npos) << older;
  EXPECT_EQ(current, "");
}

// The calibration's meter: a child process's busy loop is others' time, this process's own
// is not. (Other tests beside this one add to "others", so only lower bounds on it hold.)
TEST(Plan, OthersCpuCountsOtherProcessesOnly) {
  auto spin_cpu = [](double seconds) {  // busy until this thread has used `seconds` of CPU
    auto now = [] {
      timespec t{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
      return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
    };
    const double end = now() + seconds;
    volatile double x = 1;
    while (now() < end)
      for (int i = 0; i < 10000; ++i) x = x * 1.0000001 + 1e-9;
  };
  {
    const OthersCpu others;
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      spin_cpu(0.4);
      _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_GE(others.seconds(), 0) << "/proc/stat unreadable";
    EXPECT_GT(others.seconds(), 0.35);  // the child's 0.4 s, less the counters' ticks
    EXPECT_GT(others.share(), 0.0);
  }
  // On one core, this thread's own 0.5 s of CPU is not counted: the others' time is at most
  // the core's wall time less it (with the counters' ticks of slack). Counted, it would exceed
  // that unless the core idled half the time.
  cpu_set_t all, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &all)) {
      CPU_SET(c, &one);
      break;
    }
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const auto start = std::chrono::steady_clock::now();
  const OthersCpu others;
  spin_cpu(0.5);
  const double seconds = others.seconds();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
  EXPECT_GE(seconds, 0);
  EXPECT_LE(seconds, wall - 0.5 + 0.03);
}

// The CPU compute model: attention calls that see fewer keys (ring attention's blocks) run at
// the kernel table's rate for that length, and a GEMM's operands come from memory, so the
// same flops in micro-batches of fewer rows cost more (the weights are read once a GEMM).
TEST(Plan, CpuComputeFollowsKeysAndRows) {
  auto predict_on = [](Calibration cal, std::vector<std::string> keys) {
    keys.insert(keys.end(), {"train.device=\"cpu\"", "train.precision=\"fp32\""});
    const Config cfg = gpt(keys);
    const Cluster cpu = this_machine(cal, 8);
    return predict_step(cfg, mesh_config(cfg, 8), cpu.machine, cpu.topology).compute;
  };
  const std::vector<std::string> ring = {"parallel.cp=4", "parallel.cp_impl=\"ring\"",
                                         "parallel.dp=2"};
  const std::vector<std::string> ulysses = {"parallel.cp=4", "parallel.cp_impl=\"ulysses\"",
                                            "parallel.dp=2"};
  Calibration by_keys = two_cores();
  for (KernelRates& r : by_keys.rates) r.attention_by_keys = {{64, 1e8}, {4096, 2e9}};
  EXPECT_DOUBLE_EQ(predict_on(two_cores(), ring), predict_on(two_cores(), ulysses));
  EXPECT_GT(predict_on(by_keys, ring), 1.05 * predict_on(by_keys, ulysses));

  // The same sequences a step in micro-batches of 1 or 4: the memory traffic (the compute
  // at unlimited bandwidth taken off) is larger with more, smaller micro-batches.
  Calibration fast_memory = two_cores();
  for (KernelRates& r : fast_memory.rates) r.elementwise_bytes_per_s = 1e30;
  auto traffic = [&](const char* mb, const char* ga) {
    const std::vector<std::string> keys = {"parallel.dp=8", mb, ga};
    return predict_on(two_cores(), keys) - predict_on(fast_memory, keys);
  };
  EXPECT_GT(traffic("train.micro_batch=1", "train.grad_accum=4"),
            1.2 * traffic("train.micro_batch=4", "train.grad_accum=1"));
}

}  // namespace plan_test
