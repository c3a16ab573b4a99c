// The memory estimate made from a recipe alone (plan/memory_budget.h) against the arenas a
// model of that recipe really allocates (its activations: the model's activation table,
// model/activations.h, summed to the byte), and the refusal it gives when the plan does not
// fit.
#include "plan/memory_budget.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "model/activations.h"
#include "model/model.h"
#include "parallel/pp/layout.h"
#include "parallel/pp/schedule.h"
#include "plan/layout.h"
#include "recipe/recipe.h"

using namespace pentad;

namespace {

const std::string kRecipes = std::string(PENTAD_SOURCE_DIR) + "/recipes/";

parallel::MeshConfig one_rank() {
  parallel::MeshConfig mesh;
  mesh.tp = mesh.cp = mesh.dp = mesh.pp = 1;
  return mesh;
}

// The estimate's activations (less what lives outside the model's arenas) are the buffers the
// model declared, to the byte; and those are what its arenas hold, each buffer rounded up to
// their alignment and each large arena to a page.
void expect_the_models_activations(const Model& model, double estimate) {
  const double declared = model.declared_activation_bytes();
  EXPECT_EQ(estimate, declared);
  double arenas = 1;  // the scratch
  for (int c = 0; c < model.chunks(); ++c) arenas += model.slots_made(c);
  const double padding = double(model.activation_bytes()) - declared;
  EXPECT_GE(padding, 0);
  EXPECT_LT(padding, double(Arena::kAlignment) * double(model.declared_activation_buffers()) +
                         double(Arena::kPageBytes) * arenas);
}

TEST(MemoryBudget, EstimateMatchesTheArenasOfOneRank) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> rows = {
      {"gpt-tiny.toml", {}},
      {"llama-tiny.toml", {}},
      {"gpt-tiny.toml", {"model.recompute=true"}},
      {"llama-tiny.toml", {"model.n_layer=3", "model.d_model=128", "train.micro_batch=3"}},
      {"llama-tiny.toml", {"model.tie_embeddings=true", "model.d_ff=200"}},
      {"mixtral-tiny.toml", {}},
      {"moe-fine-tiny.toml", {}},
      {"moe-fine-tiny.toml", {"model.n_shared_experts=0", "model.moe_layers=0,2"}},
      {"gpt-tiny.toml",
       {"model.moe_layers=every:2", "model.n_experts=4", "model.n_shared_experts=2"}},
  };
  for (const auto& [recipe, overrides] : rows) {
    SCOPED_TRACE(recipe + " " + (overrides.empty() ? "" : overrides.front()));
    const Config cfg = load_recipe(kRecipes + recipe, overrides);
    Model model(cfg.model, cfg.train.micro_batch, cfg.train.seq_len);
    const ParamStore& p = model.params();
    const double measured = double(4 * p.bytes() + model.activation_bytes());
    const MemoryEstimate e = estimate_memory(cfg, one_rank());
    double values = 0, experts = 0;  // p.numel() counts the alignment padding too
    for (const ParamSpec& spec : p.specs()) {
      values += double(spec.local_shape.numel());
      if (spec.expert) experts += double(spec.local_shape.numel());
    }
    EXPECT_EQ(e.values, values);
    EXPECT_EQ(e.expert_values, experts);
    // The count the `model:` line prints, whatever the layout (pp and ep split the model).
    Config split = cfg;
    split.parallel.pp = 2;
    split.parallel.tp = 2;
    EXPECT_EQ(double(model_parameters(split)), values);
    // MoE dispatch buffers are sized at each forward (MoeBlock::Acts), not up front.
    EXPECT_NEAR((e.total() - e.dispatch) / measured, 1.0, 0.02)
        << "estimate " << e.total() - e.dispatch << ", measured " << measured;
    expect_the_models_activations(model, e.activations - e.dispatch);
  }
}

// A tp rank's view without its group: the hooks' shape, no communication (building a model
// communicates nothing).
struct TpShape final : TensorParallelHooks {
  int p, d2, r;
  bool sp;
  TpShape(int p_, int d2_, int r_, bool sp_) : p(p_), d2(d2_), r(r_), sp(sp_) {}
  int degree() const override { return p; }
  int rank() const override { return r; }
  bool sequence_parallel() const override { return sp; }
  int heads_degree() const override { return p / d2; }
  int heads_rank() const override { return r / d2; }
  int hidden_degree() const override { return d2; }
  int hidden_rank() const override { return r % d2; }
};

// 1D and 2D tp: the values a rank holds and its activations exactly (the estimate also
// counts 2D tp's exchange buffers, which are no part of the model's arenas).
TEST(MemoryBudget, EstimateMatchesTheArenasOfATpRank) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> rows = {
      {"gpt-tiny.toml", {"parallel.tp=4"}},
      {"gpt-tiny.toml", {"parallel.tp=4", "parallel.tp_shape=2x2"}},
      {"gpt-tiny.toml",
       {"parallel.tp=4", "parallel.tp_shape=1x4", "parallel.sequence_parallel=true"}},
      {"llama-tiny.toml",
       {"parallel.tp=4", "parallel.tp_shape=2x2", "parallel.sequence_parallel=true"}},
      {"mixtral-tiny.toml",
       {"parallel.tp=4", "parallel.tp_shape=2x2", "parallel.sequence_parallel=true"}},
      {"llama-tiny.toml",
       {"parallel.tp=4", "parallel.tp_shape=2x2", "parallel.sequence_parallel=true",
        "model.recompute=true"}},
      {"gpt-tiny.toml", {"parallel.tp=4", "model.recompute=true"}},
      {"gpt-tiny.toml",
       {"model.moe_layers=every:2", "model.n_experts=4", "model.n_shared_experts=2",
        "parallel.tp=4", "parallel.sequence_parallel=true"}},
  };
  for (const auto& [recipe, overrides] : rows) {
    SCOPED_TRACE(recipe + " " + overrides.back());
    const Config cfg = load_recipe(kRecipes + recipe, overrides);
    const parallel::MeshConfig mesh = mesh_config(cfg, 4);
    TpShape tp(4, mesh.tp_d2, 1, cfg.parallel.sequence_parallel);
    Sharding sharding;
    sharding.tp = &tp;
    Model model(cfg.model, cfg.train.micro_batch, cfg.train.seq_len, sharding);
    double values = 0;
    for (const ParamSpec& spec : model.params().specs()) values += double(spec.local_shape.numel());
    const MemoryEstimate e = estimate_memory(cfg, mesh);
    EXPECT_EQ(e.values, values);
    const double scratch =
        mesh.tp_d2 > 1 ? 4.0 * 2 * double(cfg.train.micro_batch * cfg.train.seq_len) *
                             double(cfg.model.d_model) / (cfg.parallel.sequence_parallel ? 4 : 1)
                       : 0.0;
    expect_the_models_activations(model, e.activations - e.dispatch - scratch);
  }
}

// Each pipeline stage: its chunks' slots, as many as the schedule keeps in flight on each, and
// the scratch, as the model of that stage declares them.
TEST(MemoryBudget, EstimateMatchesTheArenasOfEachStage) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> rows = {
      {"gpt-tiny.toml", {"parallel.pp=2", "train.grad_accum=4"}},
      {"llama-tiny.toml", {"parallel.pp=2", "train.grad_accum=4", "model.recompute=true"}},
      {"moe-fine-tiny.toml", {"model.n_layer=4", "parallel.pp=2", "train.grad_accum=4"}},
      {"gpt-tiny.toml",
       {"model.n_layer=4", "parallel.pp=2", "parallel.virtual_stages=2",
        "parallel.pp_schedule=interleaved", "train.grad_accum=4"}},
  };
  for (const auto& [recipe, overrides] : rows) {
    SCOPED_TRACE(recipe + " " + overrides.back());
    const Config cfg = load_recipe(kRecipes + recipe, overrides);
    const parallel::MeshConfig mesh = mesh_config(cfg, 2);
    const int stages = 2, virtual_stages = int(cfg.parallel.virtual_stages);
    const std::vector<int64_t> layers = parallel::pp::chunk_layers(
        cfg.model.n_layer, stages, virtual_stages, cfg.parallel.pp_layout);
    for (int stage = 0; stage < stages; ++stage) {
      SCOPED_TRACE("stage " + std::to_string(stage));
      std::vector<LayerRange> layout;
      for (const parallel::pp::Chunk& c : parallel::pp::stage_chunks(layers, stages, stage))
        layout.push_back({c.layer_begin, c.layer_end, c.first, c.last});
      Model model(cfg.model, cfg.train.micro_batch, cfg.train.seq_len, Sharding{}, layout);
      const std::vector<parallel::pp::Action> actions =
          parallel::pp::stage_actions(schedule_spec(cfg), stage);
      for (int c = 0; c < model.chunks(); ++c) {
        std::vector<parallel::pp::Action> mine;
        for (const parallel::pp::Action& a : actions)
          if (a.chunk == c) mine.push_back(a);
        while (model.slots_made(c) < parallel::pp::peak_in_flight(mine)) model.add_slot(c);
      }
      if (stage == 0) {
        EXPECT_GT(model.slots_made(0), 1);  // the first stage keeps more than one in flight
      }
      const MemoryEstimate e = estimate_memory(cfg, mesh, stage);
      expect_the_models_activations(model, e.activations - e.dispatch);
    }
  }
}

// The activation table of one layer by hand: llama-tiny (C 64, 4 heads and 2 KV heads of 16,
// MLP width 256) at micro-batch 8 x 64 (N = 512 rows) on one of 2 tp ranks with sequence
// parallelism (Nl = 256 rows; 2 heads, 1 KV head, MLP width 128 here); GPT-2 (gpt-tiny: C
// 64, 4 heads, MLP width 256) adds LayerNorm's means and has no gate.
TEST(MemoryBudget, ActivationTableByHand) {
  using Rows = std::vector<std::pair<std::string, std::vector<double>>>;
  auto listed = [](const Config& cfg, double tp, bool sp) {
    const ActSizes s = activation_sizes(cfg.model, 8, 64, tp, 1, sp, DType::F32);
    ActListing listing;
    LayerActs acts;
    declare_layer(s, s.F, false, listing, acts);
    Rows rows;
    double bytes = 0;
    for (const ActRow& r : listing.rows) {
      rows.push_back({r.name, r.shape});
      double n = 1;
      for (double d : r.shape) n *= d;
      bytes += n * double(dtype_bytes(r.dtype));
    }
    EXPECT_EQ(listing.bytes, bytes);
    EXPECT_EQ(listing.buffers, int64_t(rows.size()));
    return rows;
  };
  const Rows llama = {{"norm1", {512, 64}},  {"norm1_rstd", {256}}, {"q", {512, 32}},
                      {"k", {512, 16}},      {"v", {512, 16}},      {"att", {512, 32}},
                      {"lse", {8, 2, 64}},   {"res1", {256, 64}},   {"norm2", {512, 64}},
                      {"norm2_rstd", {256}}, {"up", {512, 128}},    {"gate", {512, 128}},
                      {"act", {512, 128}}};
  EXPECT_EQ(listed(load_recipe(kRecipes + "llama-tiny.toml"), 2, true), llama);
  const Rows gpt2 = {{"norm1", {512, 64}}, {"norm1_mean", {512}}, {"norm1_rstd", {512}},
                     {"q", {512, 64}},     {"k", {512, 64}},      {"v", {512, 64}},
                     {"att", {512, 64}},   {"lse", {8, 4, 64}},   {"res1", {512, 64}},
                     {"norm2", {512, 64}}, {"norm2_mean", {512}}, {"norm2_rstd", {512}},
                     {"up", {512, 256}},   {"act", {512, 256}}};
  EXPECT_EQ(listed(load_recipe(kRecipes + "gpt-tiny.toml"), 1, false), gpt2);
}

// moe-fine-tiny by hand (C 64, 2 KV heads of 16, dense width 256, vocabulary 512): layer 0
// dense, layers 1 and 2 MoE with 16 experts of width 32 and one shared expert of width 32.
TEST(MemoryBudget, MoeParametersByHand) {
  const Config cfg = load_recipe(kRecipes + "moe-fine-tiny.toml");
  const double attention = 2 * 64 * 64 + 2 * 32 * 64 + 2 * 64;  // q, o, k, v, two norms
  const double dense = attention + 3 * 256 * 64;
  const double experts = 16 * 3 * 32 * 64;
  const double moe = attention + 16 * 64 + 16 + experts + 3 * 32 * 64;  // router, bias, shared
  const double embeddings = 2 * 512 * 64 + 64;                          // untied, final norm
  const MemoryEstimate e = estimate_memory(cfg, one_rank());
  EXPECT_EQ(e.values, dense + 2 * moe + embeddings);
  EXPECT_EQ(e.expert_values, 2 * experts);
  EXPECT_GT(e.dispatch, 0);
  EXPECT_LT(e.dispatch, e.activations);

  const MemoryEstimate dense_model =
      estimate_memory(load_recipe(kRecipes + "llama-tiny.toml"), one_rank());
  EXPECT_EQ(dense_model.expert_values, 0);
  EXPECT_EQ(dense_model.dispatch, 0);
}

// Each expert-parallel rank holds n_experts / ep experts, each etp rank 1/etp of their width;
// with more ranks sending to it, a rank may receive more rows (worst case, dropless).
TEST(MemoryBudget, MoeExpertsSplitOverEpAndEtp) {
  const Config cfg = load_recipe(kRecipes + "mixtral-tiny.toml");
  const MemoryEstimate one = estimate_memory(cfg, one_rank());
  EXPECT_EQ(one.expert_values, 2 * 8 * 3 * 128 * 64);  // 2 layers of 8 SwiGLU experts
  for (auto [ep, etp] : {std::pair{2, 1}, {1, 2}, {2, 2}, {4, 1}}) {
    SCOPED_TRACE(fmt::format("ep {} etp {}", ep, etp));
    parallel::MeshConfig mesh = one_rank();
    mesh.dp = ep * etp;
    mesh.ep = ep;
    mesh.etp = etp;
    const MemoryEstimate e = estimate_memory(cfg, mesh);
    EXPECT_EQ(e.expert_values, one.expert_values / (ep * etp));
    EXPECT_EQ(e.values - e.expert_values, one.values - one.expert_values);
    EXPECT_GT(e.dispatch, one.dispatch);  // rows from ep x etp ranks
  }
  // GPT-2 experts: the up bias splits over etp, the down bias does not.
  const Config gpt = load_recipe(kRecipes + "gpt-tiny.toml",
                                 {"model.moe_layers=all", "model.n_experts=4", "model.top_k=2"});
  parallel::MeshConfig mesh = one_rank();
  mesh.dp = mesh.etp = 2;
  const double per_expert = 2 * 256 * 64 + 256 + 64;
  EXPECT_EQ(estimate_memory(gpt, one_rank()).expert_values, 2 * 4 * per_expert);
  EXPECT_EQ(estimate_memory(gpt, mesh).expert_values, 2 * 4 * (2 * 128 * 64 + 128 + 64));
}

// The shipped large MoE recipes plan to fit an 80 GB GPU on the 64 ranks they name.
TEST(MemoryBudget, LargeMoeRecipesFitTheirLayout) {
  for (const char* name : {"mixtral-8x7b.toml", "qwen2-57b-a14b.toml"}) {
    SCOPED_TRACE(name);
    const Config cfg = load_recipe(kRecipes + name);
    const parallel::MeshConfig mesh = mesh_config(cfg, 64);
    EXPECT_EQ(mesh.ep, 8);
    const MemoryEstimate e = estimate_memory(cfg, mesh);
    EXPECT_GT(e.expert_values, 0.5 * e.values);
    EXPECT_LT(e.total(), 80e9);
    const std::string plan = describe_memory(cfg, mesh);
    for (const char* part : {"routed experts", "MoE dispatch buffers", "ep 8", "total"})
      EXPECT_NE(plan.find(part), std::string::npos) << plan << "\nmissing: " << part;
  }
}

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

}  // namespace

// ZeRO-2 and -3 free device memory as they free host memory (the sparse arenas are CUDA
// virtual memory there): a CUDA estimate's parameters and gradients are the CPU's; AdamW on
// the host holds none of its state on the device.
TEST(MemoryBudget, CudaZeroFreesLikeTheCpuAndHostAdamWHoldsNone) {
  parallel::MeshConfig mesh = one_rank();
  mesh.dp = 2;
  auto estimate = [&](const std::string& device, const std::string& zero,
                      const std::string& offload) {
    return estimate_memory(
        load_recipe(kRecipes + "gpt-tiny.toml", {"train.device=" + device, "parallel.zero=" + zero,
                                                 "parallel.offload=" + offload}),
        mesh);
  };
  for (const std::string zero : {"2", "3"}) {
    const MemoryEstimate cpu = estimate("cpu", zero, "none"), cuda = estimate("cuda", zero, "none");
    EXPECT_EQ(cuda.parameters, cpu.parameters) << "zero " << zero;
    EXPECT_EQ(cuda.gradients, cpu.gradients) << "zero " << zero;
  }
  const MemoryEstimate cuda3 = estimate("cuda", "3", "none");
  const double values = cuda3.values, f32 = 4;
  EXPECT_EQ(cuda3.optimizer, 2 * values / 2 * f32);  // ZeRO shares the moments
  EXPECT_EQ(estimate("cuda", "2", "cpu").optimizer, 0.0);
  EXPECT_EQ(estimate("cuda", "0", "cpu").optimizer, 0.0);
  EXPECT_EQ(estimate("cpu", "0", "cpu").optimizer, 2 * values * f32);  // the host is the device
  // AdamW's moments on NVMe: on CUDA updated on the host, so none on the device either; on
  // the CPU three sub-groups of m and v in (host = device) memory.
  auto nvme = [&](const std::string& device) {
    return estimate_memory(
        load_recipe(kRecipes + "gpt-tiny.toml",
                    {"train.device=" + device, "parallel.offload=nvme",
                     "parallel.offload_path=/tmp", "parallel.nvme_subgroup_kb=16"}),
        one_rank());
  };
  EXPECT_EQ(nvme("cuda").optimizer, 0.0);
  EXPECT_EQ(nvme("cpu").optimizer, 3 * 2 * 16 * 1024.0);
}

// ZeRO-2 on GPT-2 small over 4 ranks: the tied embedding's V x 768 values are one bucket
// (about 147 MiB, far beyond bucket_mb), two of them in flight, and the reduced shares S = N / 4;
// fewer gradient bytes per rank than stage 0's 4N. With a second S for the next
// micro-batch's reduction (the reducer kept one until it added into the bucket instead) the
// plan said 532 MiB against stage 0's 475 MiB.
TEST(MemoryBudget, ZeroTwoHoldsFewerGradientsThanNoZeroOnGpt2Small) {
  auto estimate = [](const std::string& zero) {
    const Config cfg = load_recipe(kRecipes + "gpt2-124m.toml", {"parallel.zero=" + zero});
    return estimate_memory(cfg, mesh_config(cfg, 4));
  };
  const MemoryEstimate none = estimate("0"), two = estimate("2");
  const ModelConfig m = load_recipe(kRecipes + "gpt2-124m.toml").model;
  const double f32 = 4, embedding = double(m.vocab_size) * double(m.d_model) * f32;
  EXPECT_EQ(none.gradients, none.values * f32);
  EXPECT_DOUBLE_EQ(two.gradients, 2 * embedding + two.values / 4 * f32);
  EXPECT_LT(two.gradients, none.gradients);
}

// ZeRO-3's parameter shares on NVMe on CUDA: no device memory holds the shares (as on the
// CPU), AdamW holds none either, and the host memory beside it holds three
// sub-groups of p, m and v, two slots of gradient staging and three upload slots of the
// largest share, more than the same run keeping the shares in device memory
// (offload_params = false: two tensors per sub-group, parameters and gradients staged).
TEST(MemoryBudget, CudaNvmeParameterSharesCountTheirHostStaging) {
  parallel::MeshConfig mesh = one_rank();
  mesh.dp = 2;
  auto estimate = [&](const std::string& device, bool params) {
    return estimate_memory(
        load_recipe(kRecipes + "gpt-tiny.toml",
                    {"train.device=" + device, "parallel.zero=3", "parallel.offload=nvme",
                     "parallel.offload_path=/tmp", "parallel.nvme_subgroup_kb=16",
                     std::string("parallel.offload_params=") + (params ? "true" : "false")}),
        mesh);
  };
  const MemoryEstimate on = estimate("cuda", true), off = estimate("cuda", false);
  const double shares = on.values / 2, f32 = 4;
  EXPECT_EQ(on.parameters, estimate("cpu", true).parameters) << "no copy of the shares";
  // Kept in device memory, the shares cost 4S; on NVMe, the largest unit's share read ahead.
  EXPECT_LT(off.parameters - on.parameters, shares * f32);
  EXPECT_GT(off.parameters - on.parameters, shares * f32 / 2);
  EXPECT_EQ(on.optimizer, 0.0);
  const double chunk = std::min(shares, double(size_t{1} << 20));
  const double subgroups = 3 * std::min(3 * shares * f32, 3 * 16 * 1024.0);
  EXPECT_GT(on.host, subgroups + 2 * chunk * f32) << "the upload slots are counted";
  EXPECT_LT(on.host, subgroups + 2 * chunk * f32 + 3 * shares * f32) << "each below a share";
  EXPECT_GT(off.host, 0.0);
  EXPECT_EQ(estimate("cpu", true).host, 0.0) << "on the CPU it is all in total()";
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
