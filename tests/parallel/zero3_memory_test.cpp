// ZeRO-3's parameter memory on the trainer itself, MoE (dp4 x ep2: the dense units over
// dp 4, the routed experts over edp 2) and dense GPT-2 (dp 4, tied head and not), measured
// against the memory plan: the pages of the parameter arena resident (mincore) after
// start-up, which must be this rank's shares S = Nd / Z + Ne / edp (README, "ZeRO"), and,
// with the gathered units' buffers, at their highest through three training steps (sampled
// at every stretch of the parameter hooks), which must be what the printed plan and `pentad
// plan`'s estimate say, each within 5% (the former "4S + 2 of the largest units whole" was
// 65% over for the MoE layout); the rank's peak resident memory in those steps, above what
// it held before the trainer, within 10% of the plan's total on every rank (on a wider GPT-2);
// and the pools making no
// buffer after the first step. The live budget (parallel.zero_live_units) bounds the units
// each reducer holds gathered, counted through the store's homes, and changes nothing in
// the losses.
#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "launch/rank.h"
#include "parallel/mesh.h"
#include "plan/memory_budget.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

using namespace pentad;

namespace {

// AddressSanitizer's allocator and quarantine change what is resident: the plain build only.
// GCC defines __SANITIZE_ADDRESS__; clang 14 (the sanitizer builds' compiler) only answers
// __has_feature.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMeasuresMemory = false;
#elif defined(__has_feature)
constexpr bool kMeasuresMemory = !__has_feature(address_sanitizer);
#else
constexpr bool kMeasuresMemory = true;
#endif

// Bytes of [base, base + bytes) whose pages are in memory.
double resident_bytes(const void* base, size_t bytes) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(base) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(base) + bytes + page - 1) / page * page;
  std::vector<unsigned char> in((end - begin) / page);
  if (mincore(reinterpret_cast<void*>(begin), end - begin, in.data()) != 0) return -1;
  return double(std::count_if(in.begin(), in.end(), [](unsigned char c) { return c & 1; })) *
         double(page);
}

// The resident bytes of the parameter arena and of the gathered units' buffers (the pages
// under every parameter with a home, each page once).
double parameters_resident(const ParamStore& p) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  std::vector<std::pair<uintptr_t, uintptr_t>> pages;
  for (int id = 0; id < int(p.specs().size()); ++id)
    if (p.placed(id)) {
      const auto at = reinterpret_cast<uintptr_t>(p.param(id).data);
      pages.emplace_back(at / page * page, (at + p.param(id).bytes() + page - 1) / page * page);
    }
  std::sort(pages.begin(), pages.end());
  double total = resident_bytes(p.all_params().data, p.bytes());
  uintptr_t done = 0;
  for (auto [begin, end] : pages) {
    begin = std::max(begin, done);
    if (begin < end) total += resident_bytes(reinterpret_cast<void*>(begin), end - begin);
    done = std::max(done, end);
  }
  return total;
}

// ZeRO-3's units as the trainer cuts them (train/trainer_zero.cpp): runs of parameters with
// the same key ("layers.<l>", or none: the embedding before the layers, the head after), the
// routed experts of a layer a unit of their own (the experts' reducer).
std::vector<std::pair<bool, int>> units_of(const ParamStore& p) {
  std::vector<std::pair<bool, int>> units;
  std::string open;
  int run = -1;
  for (const ParamSpec& s : p.specs()) {
    const std::string key =
        s.name.rfind("layers.", 0) == 0 ? s.name.substr(0, s.name.find('.', 7)) : std::string();
    if (run < 0 || key != open) ++run;
    open = key;
    units.emplace_back(s.expert, run);
  }
  return units;
}

// The model's parameter hooks (ZeRO-3's gathers), with the parameters' resident bytes and
// the units gathered (a parameter with a home is in a unit's buffer) sampled after each
// stretch's gathers and before its drops.
class Sampled final : public ParameterHooks {
 public:
  Sampled(ParameterHooks* inner, const ParamStore& params)
      : inner_(inner), params_(params), units_(units_of(params)) {}
  void need(const std::vector<int>& ids, bool backward) override {
    inner_->need(ids, backward);
    sample();
  }
  void done(const std::vector<int>& ids) override {
    // Open MPI without a progress thread moves a prefetched all-gather only inside MPI
    // calls: a few barriers (every rank passes the same stretches) let each started gather
    // land before the sample, as the plan counts it, whatever the timing of this run.
    for (int i = 0; i < 4; ++i) MPI_Barrier(MPI_COMM_WORLD);
    sample();
    inner_->done(ids);
  }
  double peak = 0;
  int dense_units = 0, expert_units = 0;  // the most gathered at once, per reducer

 private:
  void sample() {
    peak = std::max(peak, parameters_resident(params_));
    std::set<std::pair<bool, int>> whole;
    for (int id = 0; id < int(params_.specs().size()); ++id)
      if (params_.placed(id)) whole.insert(units_[size_t(id)]);
    const auto experts = std::count_if(whole.begin(), whole.end(), [](auto u) { return u.first; });
    dense_units = std::max(dense_units, int(whole.size()) - int(experts));
    expert_units = std::max(expert_units, int(experts));
  }
  ParameterHooks* inner_;
  const ParamStore& params_;
  std::vector<std::pair<bool, int>> units_;  // per parameter id
};

// This process's resident memory now and at its highest (bytes, /proc/self/status); the
// highest is reset to now by reset_peak_resident().
double status_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(std::string(field).size())) * 1024;
  return -1;
}
bool reset_peak_resident() {
  return bool(std::ofstream("/proc/self/clear_refs") << "5");
}

// "parameters 1.5 MiB" (item "parameters") of the printed plan, in bytes.
double plan_bytes(const std::string& plan, const std::string& item) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(plan, m, std::regex(item + R"( ([\d.]+) (B|KiB|MiB|GiB))")))
      << plan;
  const double unit = m[2] == "GiB"   ? 1 << 30
                      : m[2] == "MiB" ? 1 << 20
                      : m[2] == "KiB" ? 1 << 10
                                      : 1;
  return std::stod(m[1]) * unit;
}

}  // namespace

// What a run of check_stage_three saw.
struct Seen {
  std::vector<float> losses;
  int dense_units = 0, expert_units = 0;  // the most gathered at once, per reducer
};

// Trains three steps under `keys` on the 4 ranks (dense parameters over dp = 4, routed
// experts over `edp`) with `live_units` units at most gathered per reducer, and compares
// the parameters' resident bytes, and the rank's peak, with the plans.
static Seen check_stage_three(const std::string& name, const std::vector<std::string>& keys,
                              int edp, int live_units = 2, bool rank_peak_as_planned = false) {
  Seen seen;
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 4) {
    ADD_FAILURE() << "needs mpirun with 4 ranks";  // the callers skip first
    return seen;
  }
  std::vector<std::string> all = keys;
  all.insert(all.end(),
             {"train.seq_len=32", "train.micro_batch=2", "train.steps=3", "train.threads=1",
              "train.eval_every=0", "data.source=random", "parallel.zero=3",
              "parallel.zero_live_units=" + std::to_string(live_units)});
  const Config cfg = parse_recipe("", name, all);
  launch::start_rank(cfg);
  const parallel::MeshConfig layout = mesh_config(cfg, world);
  parallel::Mesh mesh = parallel::Mesh::create(layout, MPI_COMM_WORLD);
  EXPECT_EQ(mesh.degree(parallel::Axis::DP), 4);
  if (cfg.model.is_moe()) {
    EXPECT_EQ(mesh.degree(parallel::Axis::EDP), edp);
  }
  // The rank's memory from here on is the trainer's (the peak: since here).
  const double before = status_bytes("VmRSS:");
  const bool peak_reset = reset_peak_resident();
  Trainer trainer(cfg, &mesh);
  const ParamStore& p = trainer.model().params();
  double dense = 0, experts = 0;
  for (const ParamSpec& s : p.specs())
    (s.expert ? experts : dense) += double(s.local_shape.numel()) * sizeof(float);
  const double shares = dense / 4 + experts / edp;  // S = Nd / Z + Ne / edp, in bytes
  const double after_start = resident_bytes(p.all_params().data, p.bytes());
  EXPECT_NEAR(after_start, shares, 0.05 * shares)
      << "after start-up: this rank's shares of the dense parameters and of the experts";

  ParameterHooks* const gathers = trainer.model().parameter_hooks();
  Sampled sampled(gathers, p);
  trainer.model().set_parameter_hooks(&sampled);
  std::vector<int64_t> made;  // the pools' buffers after each step
  for (int64_t step = 0; step < 3; ++step) {
    seen.losses.push_back(trainer.train_step(step).loss);
    made.push_back(trainer.zero_buffers_made());
  }
  std::printf("rank %d: pool buffers made after each step: %lld %lld %lld\n", mesh.world().rank(),
              (long long)made[0], (long long)made[1], (long long)made[2]);
  EXPECT_EQ(made[2], made[0]) << "the pools made buffers after the first step";
  const double rank_peak = status_bytes("VmHWM:") - before;
  const std::string printed = trainer.memory_plan();
  const double plan = plan_bytes(printed, "parameters"), total = plan_bytes(printed, "total");
  const double estimate = estimate_memory(cfg, layout).parameters;
  std::printf(
      "%s, live units %d, rank %d: parameters resident %.0f KiB after start-up (S %.0f KiB), "
      "peak %.0f KiB in a step, units gathered at once %d dense, %d experts; plan %.0f KiB, "
      "estimate %.0f KiB; rank's peak %.0f KiB above start, plan's total %.0f KiB\n",
      name.c_str(), live_units, mesh.world().rank(), after_start / 1024, shares / 1024,
      sampled.peak / 1024, sampled.dense_units, sampled.expert_units, plan / 1024, estimate / 1024,
      rank_peak / 1024, total / 1024);
  EXPECT_NEAR(sampled.peak, plan, 0.05 * plan) << "the printed memory plan's parameters";
  EXPECT_NEAR(sampled.peak, estimate, 0.05 * estimate) << "pentad plan's parameters";
  if (rank_peak_as_planned && peak_reset) {
    // Every rank: the gradient buckets' reduce-scatter is pentad's ring, two blocks of
    // scratch on each rank (Open MPI's libnbc, which it replaced, held scratch copies of the
    // pending buckets on the inner ranks of its tree: 20-30% above the plan on ranks 0 and 2).
    double lowest = rank_peak, highest = rank_peak;
    MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &highest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_NEAR(lowest, total, 0.10 * total) << "the lowest rank's peak against the plan's total";
    EXPECT_NEAR(highest, total, 0.10 * total) << "the highest rank's peak against the plan's total";
  }
  trainer.model().set_parameter_hooks(gathers);
  seen.dense_units = sampled.dense_units;
  seen.expert_units = sampled.expert_units;
  return seen;
}

static bool four_plain_ranks() {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  return world == 4 && kMeasuresMemory;
}

// moe-fine-tiny widened so that a unit is many pages: 16 experts of width 64 top-4 and a
// shared one over d_model 256, the first layer dense (and wide: the largest unit, whole
// beside the embedding and beside the first MoE layer, whose experts are prefetched from it);
// 3.2M values on each rank, the experts over ep 2 and edp 2.
TEST(Zero3Memory, StageThreeParametersResidentAsThePlanSays) {
  if (!four_plain_ranks()) GTEST_SKIP() << "needs mpirun with 4 ranks, outside ASan";
  const Seen seen = check_stage_three(
      "dp4xep2",
      {"model.family=llama", "model.n_layer=4", "model.d_model=256", "model.n_head=4",
       "model.n_kv_head=2", "model.vocab_size=1024", "model.max_seq_len=64",
       "model.tie_embeddings=false", "model.moe_layers=from:1", "model.n_experts=16",
       "model.top_k=4", "model.d_ff_expert=64", "model.n_shared_experts=1", "moe.score=sigmoid",
       "parallel.ep=2"},
      2);
  EXPECT_EQ(seen.dense_units, 2);
  EXPECT_EQ(seen.expert_units, 2);
}

// Dense GPT-2 with a tied head (the final stretch reads the embedding's unit: two units
// whole there whatever the budget): dp 4.
TEST(Zero3Memory, DenseStageThreeWithATiedHeadAsThePlanSays) {
  if (!four_plain_ranks()) GTEST_SKIP() << "needs mpirun with 4 ranks, outside ASan";
  const std::vector<std::string> gpt2 = {
      "model.family=gpt2",     "model.n_layer=4",      "model.d_model=256",        "model.n_head=4",
      "model.vocab_size=2048", "model.max_seq_len=64", "model.tie_embeddings=true"};
  EXPECT_EQ(check_stage_three("dp4-gpt2-tied", gpt2, 1).dense_units, 2);
  EXPECT_EQ(check_stage_three("dp4-gpt2-tied", gpt2, 1, /*live_units=*/1).dense_units, 2);
}

// parallel.zero_live_units on dense GPT-2 with an untied head (each stretch reads one unit):
// 1 gathers each unit where it is needed and holds no other, 2 prefetches the next one, 3
// can prefetch no further than that; the plan follows each, and the losses are bitwise
// those of every other budget (the budget moves gathers in time, never values).
TEST(Zero3Memory, LiveUnitsBoundTheUnitsGatheredAndNotTheLosses) {
  if (!four_plain_ranks()) GTEST_SKIP() << "needs mpirun with 4 ranks, outside ASan";
  const std::vector<std::string> gpt2 = {"model.family=gpt2",         "model.n_layer=4",
                                         "model.d_model=256",         "model.n_head=4",
                                         "model.vocab_size=2048",     "model.max_seq_len=64",
                                         "model.tie_embeddings=false"};
  std::vector<Seen> seen;
  for (int live = 1; live <= 3; ++live)
    seen.push_back(check_stage_three("dp4-gpt2", gpt2, 1, live));
  EXPECT_EQ(seen[0].dense_units, 1) << "one unit at a time: no prefetch";
  EXPECT_EQ(seen[1].dense_units, 2) << "the unit computing and the next one";
  EXPECT_EQ(seen[2].dense_units, 2) << "prefetch goes one unit ahead";
  for (int live = 2; live <= 3; ++live) {
    ASSERT_EQ(seen[size_t(live - 1)].losses.size(), seen[0].losses.size());
    for (size_t k = 0; k < seen[0].losses.size(); ++k)
      EXPECT_EQ(seen[size_t(live - 1)].losses[k], seen[0].losses[k])
          << "step " << k << ", live units " << live << " against 1";
  }
}

// The rank's whole peak against the plan's total, on GPT-2 widened until its state (about
// 150 MiB a rank) dwarfs what a process allocates beside the plan (MPI's and OpenBLAS's
// buffers, the data loader): dp 4, untied head, live budget 2.
TEST(Zero3Memory, RankPeakWithinTenPercentOfThePlan) {
  if (!four_plain_ranks()) GTEST_SKIP() << "needs mpirun with 4 ranks, outside ASan";
  check_stage_three("dp4-gpt2-wide",
                    {"model.family=gpt2", "model.n_layer=4", "model.d_model=512", "model.n_head=8",
                     "model.vocab_size=8192", "model.max_seq_len=64", "model.tie_embeddings=false"},
                    1, 2, /*rank_peak_as_planned=*/true);
}
