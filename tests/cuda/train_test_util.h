#pragma once
// The GPU suite's training runs (tests/cuda/cuda_train_test.cpp, cuda_zero_test.cpp,
// cuda_moe_test.cpp, cuda_layout_test.cpp): the Markov-chain data, the two tiny models, the
// whole recipe, a run's trajectory, and the step-by-step loss comparison with its tolerances
// (their derivation: cuda_train_test.cpp). Under mpirun a run trains on a mesh of every
// rank (the layout from the recipe's parallel.* keys), with the communicators the executable
// would pick: NCCL with a GPU per rank, the staged backend where ranks share one.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <system_error>
#include <vector>

#include "core/device_memory.h"
#include "core/rng.h"
#include "data/token_files.h"
#include "launch/rank.h"
#include "parallel/mesh.h"
#include "plan/layout.h"
#include "plan/memory_budget.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

namespace pentad::cuda_train {

namespace fs = std::filesystem;

constexpr int64_t kSteps = 20;
constexpr int64_t kVocab = 256;
constexpr double kFp32LossTol = 1e-4;      // relative, every step
constexpr double kFp32GradNormTol = 1e-4;  // relative, step 1
constexpr double kBf16LossTol = 1e-2;      // relative, every step
constexpr double kBf16GradNormTol = 1e-2;  // relative, step 1

inline bool have_device() {
  return cuda_device_count() > 0;
}

// A Markov chain over kVocab tokens: token c is followed by one of 4 successors, chosen
// from c by a hash; which of the 4 comes next is drawn from position i. 2^17 tokens, written
// once per test process as an llm.c shard into a private directory removed at exit.
class MarkovShard {
 public:
  MarkovShard()
      : dir_(fs::temp_directory_path() / ("pentad-cuda-train-" + std::to_string(::getpid()))) {
    fs::create_directories(dir_);
    std::vector<int32_t> tokens(1 << 17);
    uint64_t current = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>(current);
      const uint64_t choice = splitmix64(0x5eed0000 + i) % 4;
      current = splitmix64(current * 4 + choice) % kVocab;
    }
    path_ = (dir_ / "markov.bin").string();
    data::write_llmc_shard(path_, tokens);
  }
  ~MarkovShard() {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  fs::path dir_;
  std::string path_;
};

inline const std::string& markov_shard() {
  static const MarkovShard shard;
  return shard.path();
}

struct ModelCase {
  const char* name;
  std::vector<std::string> model;  // model.* overrides
  int64_t seq_len;
};

// How gtest prints the parameter (and so the failure messages).
inline void PrintTo(const ModelCase& m, std::ostream* os) {
  *os << m.name;
}

// GPT-2: 3 layers, width 128, 4 heads of 32. LLaMA: 3 layers, width 256, 4 query heads of 64
// sharing 2 kv heads, SwiGLU width 768 (the LLaMA rule), untied head.
inline const ModelCase kGpt2{"gpt2",
                             {"model.family=gpt2", "model.n_layer=3", "model.d_model=128",
                              "model.n_head=4", "model.n_kv_head=0", "model.max_seq_len=128"},
                             128};
inline const ModelCase kLlama{
    "llama",
    {"model.family=llama", "model.n_layer=3", "model.d_model=256", "model.n_head=4",
     "model.n_kv_head=2", "model.max_seq_len=256", "model.tie_embeddings=false"},
    256};
// The same LLaMA with every MLP routed: 4 SwiGLU experts of width 256, top 2 by softmax,
// renormalised, with the auxiliary balancing loss. fp32 and bf16 (bf16 MoE refuses expert
// parallelism, model.cpp).
inline const ModelCase kLlamaMoe{
    "llama_moe",
    {"model.family=llama", "model.n_layer=3", "model.d_model=256", "model.n_head=4",
     "model.n_kv_head=2", "model.max_seq_len=256", "model.tie_embeddings=false",
     "model.moe_layers=all", "model.n_experts=4", "model.top_k=2", "model.d_ff_expert=256",
     "moe.aux_loss_coef=0.01"},
    256};

// The whole recipe is stated here (parse_recipe with no text starts from config.h's
// defaults, applies these keys and validates the result), so the test reads no recipe file.
// extra: more keys (parallel.zero, parallel.offload, ...), applied last.
inline Config make_config(const ModelCase& m, const std::string& device,
                          const std::string& precision,
                          const std::vector<std::string>& extra = {}) {
  std::vector<std::string> sets = m.model;
  const std::vector<std::string> rest = {
      "model.vocab_size=" + std::to_string(kVocab),
      "optim.lr=1e-3",
      "optim.warmup_steps=5",
      "optim.decay=cosine",
      "optim.min_lr_ratio=0.1",
      "optim.weight_decay=0.1",
      "optim.grad_clip=1.0",
      "train.steps=" + std::to_string(kSteps),
      "train.micro_batch=4",
      "train.seq_len=" + std::to_string(m.seq_len),
      "train.grad_accum=2",
      "train.seed=1234",
      "train.eval_every=0",
      "train.threads=2",  // CPU threads: scripts/gpu_test.sh runs several tests at once
      "train.device=" + device,
      "train.precision=" + precision,
      "data.source=llmc",
      "data.path=\"" + markov_shard() + "\"",
  };
  sets.insert(sets.end(), rest.begin(), rest.end());
  sets.insert(sets.end(), extra.begin(), extra.end());
  return parse_recipe("", std::string("cuda_train_test/") + m.name, sets);
}

struct Trajectory {
  std::vector<float> losses;
  std::vector<double> grad_norms;
  std::vector<std::string> names;                      // of the parameters
  std::vector<std::vector<float>> weights;             // final master parameters, on the host
  parallel::Backend backend = parallel::Backend::MPI;  // of the mesh's communicators
  std::optional<parallel::MeshConfig> mesh;            // the layout, if it ran on a mesh
  DeviceMemoryUse
      memory;  // this rank's memory (on the CPU: arenas only), peaks over the trainer's life
  double planned_bytes = 0;  // the memory plan's total for the layout (its largest rank)
};

// Ranks of MPI_COMM_WORLD; 1 where MPI is not initialised (the one-rank programs).
inline int world_size() {
  int initialized = 0, size = 1;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// on_mesh = false: one rank alone, even under mpirun (a layout test's reference). steps:
// fewer than kSteps for the layout tests.
inline Trajectory train(const ModelCase& m, const std::string& device, const std::string& precision,
                        const std::vector<std::string>& extra = {}, bool on_mesh = true,
                        int64_t steps = kSteps) {
  std::vector<std::string> keys = extra;
  if (steps != kSteps) keys.push_back("train.steps=" + std::to_string(steps));
  const Config cfg = make_config(m, device, precision, keys);
  // Threads, the GPU and the communicators' backend, as the executable sets them.
  const parallel::Backend backend = launch::start_rank(cfg);
  std::optional<parallel::Mesh> mesh;
  const int world = world_size();
  if (world > 1 && on_mesh)
    mesh.emplace(parallel::Mesh::create(mesh_config(cfg, world), MPI_COMM_WORLD, backend));
  reset_device_memory_peak();  // what earlier runs left (workspaces) stays counted
  reset_host_arena_peak();
  Trainer trainer(cfg, mesh ? &*mesh : nullptr);
  // Guards against a silent fallback: a "cuda" run that computed on the CPU would match the
  // CPU reference bitwise and pass every comparison below.
  const ParamStore& params = trainer.model().params();
  EXPECT_EQ(params.device(), device == "cuda" ? Device::CUDA : Device::CPU) << m.name;
  EXPECT_EQ(params.compute_dtype(), precision == "bf16" ? DType::BF16 : DType::F32) << m.name;
  Trajectory run;
  run.backend = backend;
  if (mesh) run.mesh = mesh->config();
  for (int64_t step = 0; step < steps; ++step) {
    const StepStats s = trainer.train_step(step);
    run.losses.push_back(s.loss);
    run.grad_norms.push_back(s.grad_norm);
  }
  run.memory = device_memory_use();
  if (device != "cuda") {  // the host's arenas, counted alike
    const HostArenaUse host = host_arena_use();
    run.memory.arena_bytes = host.bytes;
    run.memory.arena_peak_bytes = host.peak_bytes;
  }
  run.planned_bytes = estimate_memory(cfg, mesh ? mesh->config() : mesh_config(cfg, 1)).total();
  // Under ZeRO-3 the arena holds this rank's shares only: names, no weights.
  for (int id = 0; id < static_cast<int>(params.specs().size()); ++id) {
    run.names.push_back(params.spec(id).name);
    if (!params.sparse_params()) run.weights.push_back(params.to_host(id));
  }
  return run;
}

inline double relative(double got, double want) {
  return std::abs(got - want) / std::abs(want);
}

// Every loss of `got` within `tol` of `want` (relative), finite, step by step. Prints both
// trajectories (run the test binary itself to see them when the test passes).
inline void expect_losses_close(const Trajectory& got, const Trajectory& want, double tol,
                                const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  std::printf("step  CPU fp32 loss  %s loss  relative difference (bound %.0e)\n", what.c_str(),
              tol);
  for (size_t i = 0; i < got.losses.size(); ++i)
    std::printf("%4zu  %13.6f  %*.6f  %.2e\n", i + 1, double(want.losses[i]), int(what.size()) + 5,
                double(got.losses[i]), relative(got.losses[i], want.losses[i]));
  for (size_t i = 0; i < got.losses.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got.losses[i])) << what << ": step " << i + 1;
    EXPECT_LT(relative(got.losses[i], want.losses[i]), tol)
        << what << ": step " << i + 1 << " loss " << got.losses[i] << ", CPU fp32 "
        << want.losses[i];
  }
}

}  // namespace pentad::cuda_train
