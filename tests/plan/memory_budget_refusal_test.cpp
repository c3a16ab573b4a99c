// The memory estimate's verdict (plan/memory_budget.h): the refusal it gives when the plan
// does not fit, naming the keys and the ways to fit; the limit as the rank's share of the
// machine or its cgroup; and the line a plan that fits logs.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "core/check.h"
#include "memory_budget_test_util.h"
#include "plan/memory_budget.h"
#include "recipe/recipe.h"

using namespace pentad;

namespace {

using pentad::memory_budget_test_util::kRecipes;
using pentad::memory_budget_test_util::one_rank;

TEST(MemoryBudget, RefusesFastNamingTheKeys) {
  const auto start = std::chrono::steady_clock::now();
  const Config cfg = load_recipe(kRecipes + "gpt-tiny.toml",
                                 {"model.n_layer=100000", "train.memory_limit_mb=1024"});
  try {
    check_memory(cfg, one_rank(), NodeShare{});
    ADD_FAILURE() << "100000 layers fit in 1 GiB";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const char* part : {"gpt-tiny.toml", "does not fit", "above train.memory_limit_mb = 1024",
                             "model.n_layer <= ", "parallel.tp x parallel.pp"})
      EXPECT_NE(message.find(part), std::string::npos) << message << "\nmissing: " << part;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.5);
}

TEST(MemoryBudget, TheLimitIsTheRanksShareOfTheMachine) {
  Config cfg = load_recipe(kRecipes + "gpt-tiny.toml");
  NodeShare node;
  node.ranks = 8;
  node.memory_bytes = 8 * 64.0 * 1024 * 1024;  // 64 MiB a rank: gpt-tiny fits
  EXPECT_NO_THROW(check_memory(cfg, one_rank(), node));
  node.memory_bytes = 8 * 4.0 * 1024 * 1024;  // 4 MiB a rank: it does not
  EXPECT_THROW(check_memory(cfg, one_rank(), node), Error);
  cfg.train.memory_limit_mb = 64;  // the key wins over the share
  EXPECT_NO_THROW(check_memory(cfg, one_rank(), node));
}

// model.recompute = "auto": on only where the plan does not fit without it, against the
// limit check_memory applies (the key, else the rank's share of its machine or GPU).
TEST(MemoryBudget, AutoRecomputeOnlyWhereThePlanNeedsIt) {
  auto llama = [](const std::string& limit_mb) {
    return load_recipe(kRecipes + "llama-1b.toml",
                       {"train.device=cuda", "train.precision=bf16", "model.recompute=auto",
                        "train.memory_limit_mb=" + limit_mb});
  };
  Config off = llama("0"), on = off;
  off.model.recompute = false;
  on.model.recompute = true;
  const double without = estimate_memory(off, one_rank()).total();
  const double with = estimate_memory(on, one_rank()).total();
  ASSERT_LT(with, without);
  const double mib = 1024.0 * 1024.0;
  // Between the two: only recompute fits. Above both: it is left off.
  Config tight = llama(std::to_string(int64_t((with + without) / 2 / mib)));
  const std::string why = resolve_recompute(tight, one_rank(), NodeShare{});
  EXPECT_TRUE(tight.model.recompute);
  EXPECT_TRUE(tight.model.recompute.automatic) << "the recipe still says auto";
  EXPECT_NE(why.find("model.recompute = \"auto\": on"), std::string::npos) << why;
  Config roomy = llama(std::to_string(int64_t(without / mib) + 64));
  EXPECT_NE(resolve_recompute(roomy, one_rank(), NodeShare{}).find("off"), std::string::npos);
  EXPECT_FALSE(roomy.model.recompute);
  // Without the key, on CUDA: the GPU's memory over the ranks that share it.
  Config shared = llama("0");
  NodeShare node;
  node.device_bytes = 1.5 * without;
  resolve_recompute(shared, one_rank(), node);
  EXPECT_FALSE(shared.model.recompute) << "one rank on the GPU";
  node.device_ranks = 2;
  resolve_recompute(shared, one_rank(), node);
  EXPECT_TRUE(shared.model.recompute) << "two ranks on the GPU";
  // A recipe that says true or false is left as it is.
  Config fixed = llama("1");
  fixed.model.recompute = false;
  EXPECT_EQ(resolve_recompute(fixed, one_rank(), NodeShare{}), "");
  EXPECT_FALSE(fixed.model.recompute);
}

// The refusal names the memory, where its size came from and how many ranks share it, and
// keeps its ways to fit.
TEST(MemoryBudget, TheRefusalNamesTheCgroup) {
  const Config cfg = load_recipe(kRecipes + "gpt-tiny.toml");
  NodeShare node;
  node.ranks = 2;
  node.memory_bytes = 10.0 * 1024 * 1024 * 1024;
  node.memory_source = "cgroup /slurm/job_42 (memory.max)";
  EXPECT_EQ(describe_node_memory(node),
            "10.0 GiB from cgroup /slurm/job_42 (memory.max), 2 ranks share it");
  node.memory_bytes = 2 * 4.0 * 1024 * 1024;
  try {
    check_memory(cfg, one_rank(), node);
    ADD_FAILURE() << "gpt-tiny fit in 4 MiB";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const char* part : {"does not fit",
                             "8.0 MiB from cgroup /slurm/job_42 (memory.max), 2 ranks share it: "
                             "4.0 MiB each",
                             "parallel.tp x parallel.pp", "set train.memory_limit_mb"})
      EXPECT_NE(message.find(part), std::string::npos) << message << "\nmissing: " << part;
  }
}

// node_share() takes the lower of the machine's memory and its cgroup's limit, and the soft
// bound beside it (a fake tree under PENTAD_CGROUP_ROOT, core/cgroup.h).
TEST(MemoryBudget, NodeShareReadsTheJobsCgroup) {
  const std::filesystem::path root = std::filesystem::temp_directory_path() /
                                     ("pentad_memory_budget_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(root / "proc/self");
  std::filesystem::create_directories(root / "sys/fs/cgroup/slurm/job_42/step_0");
  std::ofstream(root / "proc/self/cgroup") << "0::/slurm/job_42/step_0\n";
  std::ofstream(root / "sys/fs/cgroup/slurm/job_42/memory.max") << (64 << 20) << "\n";
  std::ofstream(root / "sys/fs/cgroup/slurm/job_42/memory.high") << (48 << 20) << "\n";
  setenv("PENTAD_CGROUP_ROOT", root.c_str(), 1);
  const NodeShare node = node_share();
  unsetenv("PENTAD_CGROUP_ROOT");
  std::filesystem::remove_all(root);
  EXPECT_EQ(node.memory_bytes, double(64 << 20));
  EXPECT_EQ(node.memory_source, "cgroup /slurm/job_42 (memory.max)");
  EXPECT_EQ(node.memory_high, double(48 << 20));
  EXPECT_EQ(node.memory_high_source, "cgroup /slurm/job_42 (memory.high)");
  const NodeShare machine = node_share();  // this machine's own cgroup (often none)
  EXPECT_GT(machine.memory_bytes, 0.0);
  EXPECT_FALSE(machine.memory_source.empty());
}

// A plan that fits says what it fits in (once a machine), and warns above memory.high.
TEST(MemoryBudget, FitLogsTheMemoryAndWarnsAboveTheSoftBound) {
  const Config cfg = load_recipe(kRecipes + "gpt-tiny.toml");
  NodeShare node;
  node.ranks = 2;
  node.memory_bytes = 2 * 64.0 * 1024 * 1024;
  node.memory_source = "cgroup /job (memory.max)";
  node.memory_high = 2 * 4.0 * 1024 * 1024;
  node.memory_high_source = "cgroup /job (memory.high)";
  std::ostringstream log;
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "memory_budget_test", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  EXPECT_NO_THROW(check_memory(cfg, one_rank(), node));
  const std::string first = log.str();
  log.str("");
  node.local_rank = 1;  // the machine's other rank says nothing
  EXPECT_NO_THROW(check_memory(cfg, one_rank(), node));
  const std::string second = log.str();
  spdlog::set_default_logger(previous);
  for (const char* part :
       {"memory: 128.0 MiB from cgroup /job (memory.max), 2 ranks share it; the plan needs about",
        "soft bound 8.0 MiB from cgroup /job (memory.high)",
        "above 4.0 MiB, this rank's share of the soft bound 8.0 MiB from cgroup /job "
        "(memory.high) that 2 ranks share",
        "train.memory_limit_mb = 4,"})
    EXPECT_NE(first.find(part), std::string::npos) << first << "\nmissing: " << part;
  EXPECT_EQ(second, "");
}

// A CUDA plan that fits once AdamW's state leaves the device names parallel.offload = "cpu";
// a CPU plan never does (its state is on the host already).
TEST(MemoryBudget, CudaPlanOverTheLimitNamesCpuOffload) {
  for (const std::string device : {"cuda", "cpu"}) {
    Config cfg = load_recipe(kRecipes + "gpt2-124m.toml", {"train.device=" + device});
    const MemoryEstimate e = estimate_memory(cfg, one_rank());
    // Between the total without AdamW's state and the total with it.
    cfg.train.memory_limit_mb = int64_t((e.total() - e.optimizer / 2) / (1024 * 1024));
    try {
      check_memory(cfg, one_rank(), NodeShare{});
      ADD_FAILURE() << device << ": the plan fit";
    } catch (const Error& e) {
      const bool named =
          std::string(e.what()).find("parallel.offload = \"cpu\"") != std::string::npos;
      EXPECT_EQ(named, device == "cuda") << e.what();
    }
  }
}

// Issue 45: the advice named ZeRO and recompute only where either fit alone (never on one
// rank), and every refusal listed a checkpoint snapshot with a note about CUDA.
TEST(MemoryBudget, RefusalNamesZeroAndRecomputeAndSnapshotsOnlyWhereThereAreAny) {
  for (const char* save_every : {"0", "5"}) {
    const Config cfg =
        load_recipe(kRecipes + "gpt-tiny.toml",
                    {"model.n_layer=10000", "train.micro_batch=2", "train.seq_len=16",
                     "train.memory_limit_mb=7000", std::string("train.save_every=") + save_every});
    try {
      check_memory(cfg, one_rank(), NodeShare{});
      ADD_FAILURE() << "10000 layers fit in 7000 MiB";
    } catch (const Error& e) {
      const std::string message = e.what();
      for (const char* part :
           {"model.recompute = true (recomputes each layer's forward in "
            "backward: saves ",
            "not enough alone", "parallel.zero = 2 over ", "data-parallel ranks (now 1; "})
        EXPECT_NE(message.find(part), std::string::npos) << message << "\nmissing: " << part;
      EXPECT_EQ(message.find("CUDA"), std::string::npos) << message;
      EXPECT_EQ(message.find("checkpoint snapshot") != std::string::npos,
                std::string(save_every) != "0")
          << message;
    }
  }
}

// The in-memory checkpoint level's two copies of the state: in the CPU's total (within the
// snapshot, which the refusal names), in host memory beside a GPU's.
TEST(MemoryBudget, TheInMemoryLevelCountsTwoCopiesOfTheState) {
  for (const char* device : {"cpu", "cuda"}) {
    auto estimate = [&](const char* every) {
      return estimate_memory(
          load_recipe(kRecipes + "gpt-tiny.toml",
                      {"train.save_every=10", std::string("train.device=") + device,
                       std::string("checkpoint.memory_every=") + every}),
          one_rank());
    };
    const MemoryEstimate off = estimate("0"), on = estimate("1");
    ASSERT_GT(off.snapshot, 0) << device;
    EXPECT_DOUBLE_EQ(on.memory_level, 2 * off.snapshot) << device;
    if (std::string(device) == "cpu") {
      EXPECT_DOUBLE_EQ(on.total(), off.total() + 2 * off.snapshot);
    } else {
      EXPECT_DOUBLE_EQ(on.total(), off.total());
      EXPECT_DOUBLE_EQ(on.host, off.host + 2 * off.snapshot);
    }
  }
}

}  // namespace
