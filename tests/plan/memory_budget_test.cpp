// The memory estimate made from a recipe alone (plan/memory_budget.h) against the arenas a
// model of that recipe really allocates (its activations: the model's activation table,
// model/activations.h, summed to the byte): on one rank, a tp rank and each pipeline stage,
// and one layer's table by hand.
#include "plan/memory_budget.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "memory_budget_test_util.h"
#include "model/activations.h"
#include "model/model.h"
#include "parallel/pp/layout.h"
#include "parallel/pp/schedule.h"
#include "plan/layout.h"
#include "recipe/recipe.h"

using namespace pentad;

namespace {

using pentad::memory_budget_test_util::kRecipes;
using pentad::memory_budget_test_util::one_rank;

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
  // What a collective would write is made zeros: finite (the poisoned memory of a PENTAD_POISON
  // run would reach exp's float-to-int conversion, which UBSan refuses), values beside the point.
  void f_forward(Tensor full, const Tensor& local) override { written(full, local); }
  void f_backward(Tensor local, Tensor full) override { written(local, full); }
  void g_forward(Tensor local, Tensor full) override { written(local, full); }
  void g_backward(Tensor full, const Tensor& local) override { written(full, local); }
  static void written(Tensor out, const Tensor& in) {
    if (out.f32() != in.f32()) std::fill(out.f32(), out.f32() + out.numel(), 0.0f);
  }
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
          parallel::pp::stage_actions(schedule_spec(cfg, mesh), stage);
      for (int c = 0; c < model.chunks(); ++c) {
        while (model.slots_made(c) < parallel::pp::peak_in_flight(actions, c)) model.add_slot(c);
      }
      if (stage == 0) {
        EXPECT_GT(model.slots_made(0), 1);  // the first stage keeps more than one in flight
      }
      const MemoryEstimate e = estimate_memory(cfg, mesh, stage);
      expect_the_models_activations(model, e.activations - e.dispatch);
    }
  }
}

// The zero-bubble schedules: each slot also keeps, from B to W, what W reads, over
// activations only B reads (under sequence parallelism this rank's rows of the row-parallel
// GEMMs' output gradients; no arena but recompute's, made at the slot's first B); and zb-v places
// chunks in a V with both uses of a tied embedding on the first stage. A tp rank runs its passes on
// the hooks' shape alone (TpShape: no communication, values beside the point).
TEST(MemoryBudget, EstimateMatchesTheArenasOfEachZeroBubbleStage) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> rows = {
      {"gpt-tiny.toml", {"model.n_layer=4", "parallel.pp_schedule=zb-h1"}},
      {"gpt-tiny.toml",
       {"model.n_layer=4", "parallel.virtual_stages=2", "parallel.pp_schedule=zb-v"}},
      {"llama-tiny.toml",
       {"model.n_layer=4", "parallel.virtual_stages=2", "parallel.pp_schedule=zb-v"}},
      // Under recompute each slot keeps, per layer, W's operands with the output gradients.
      {"llama-tiny.toml",
       {"model.n_layer=4", "parallel.virtual_stages=2", "parallel.pp_schedule=zb-v",
        "model.recompute=true"}},
      {"gpt-tiny.toml", {"model.n_layer=4", "parallel.pp_schedule=zb-h1", "model.recompute=true"}},
      // Logits (512 x 2048) larger than the backward's layer gradients they lie over.
      {"gpt-tiny.toml", {"model.n_layer=4", "model.vocab_size=2048", "parallel.pp_schedule=zb-h1"}},
      // tp 2: without sequence parallelism whole rows over the activations; with it (N / 2
      // rows a residual stream) this rank's rows over them, which W gathers again; with
      // recompute too, d(attention output)'s rows in the arena.
      {"gpt-tiny.toml", {"model.n_layer=4", "parallel.tp=2", "parallel.pp_schedule=zb-h1"}},
      {"llama-tiny.toml",
       {"model.n_layer=4", "parallel.tp=2", "parallel.sequence_parallel=true",
        "parallel.pp_schedule=zb-h1"}},
      {"gpt-tiny.toml",
       {"model.n_layer=4", "parallel.tp=2", "parallel.sequence_parallel=true",
        "parallel.virtual_stages=2", "parallel.pp_schedule=zb-v"}},
      {"llama-tiny.toml",
       {"model.n_layer=4", "parallel.tp=2", "parallel.sequence_parallel=true",
        "model.recompute=true", "parallel.pp_schedule=zb-h1"}},
  };
  for (const auto& [recipe, keys] : rows) {
    SCOPED_TRACE(recipe + " " + keys.back());
    std::vector<std::string> overrides = keys;
    overrides.insert(overrides.end(), {"parallel.pp=2", "train.grad_accum=4"});
    const Config cfg = load_recipe(kRecipes + recipe, overrides);
    const int tp_degree = int(cfg.parallel.tp);
    const bool sp = cfg.parallel.sequence_parallel;
    const parallel::MeshConfig mesh = mesh_config(cfg, 2 * tp_degree);
    const parallel::pp::ScheduleSpec spec = schedule_spec(cfg, mesh);
    const std::vector<int64_t> layers =
        parallel::pp::chunk_layers(cfg.model.n_layer, 2, spec.virtual_stages, "");
    // zb-h1: a slot keeps nothing of the head, whose buffers lie over the backward's scratch,
    // so both stages hold p; but where the logits outgrow that scratch (a wide vocabulary)
    // the last stage holds one micro-batch (1F1B's). zb-v has no limits.
    const bool h1 = spec.kind == parallel::pp::ScheduleKind::ZBH1;
    const bool head_beyond = stage_head_bytes(cfg, mesh)[1] > 0;
    EXPECT_EQ(head_beyond, cfg.model.vocab_size > 512);
    EXPECT_EQ(spec.zb_held_limits,
              h1 && head_beyond ? std::vector<int>({2, 1}) : std::vector<int>());
    for (int stage = 0; stage < 2; ++stage) {
      SCOPED_TRACE("stage " + std::to_string(stage));
      std::vector<LayerRange> layout;
      for (const parallel::pp::Chunk& c :
           parallel::pp::stage_chunks(layers, 2, stage, spec.placement().vee))
        layout.push_back({c.layer_begin, c.layer_end, c.first, c.last});
      const int64_t b = cfg.train.micro_batch, t = cfg.train.seq_len;
      TpShape tp(tp_degree, 1, 1, sp);
      Sharding sharding;
      if (tp_degree > 1) sharding.tp = &tp;
      Model model(cfg.model, b, t, sharding, layout);
      model.params().initialize(1);
      const std::vector<parallel::pp::Action> actions = parallel::pp::stage_actions(spec, stage);
      std::vector<int32_t> ids(size_t(b * t), 1);
      const Shape rows_c{model.rows(), cfg.model.d_model};
      Arena arena("d_output", size_t(rows_c.numel()) * sizeof(float) + 256);
      const Tensor d_output = arena.alloc(rows_c);
      std::fill(d_output.f32(), d_output.f32() + d_output.numel(), 0.0f);
      for (int c = 0; c < model.chunks(); ++c) {
        while (model.slots_made(c) < parallel::pp::peak_in_flight(actions, c)) model.add_slot(c);
        for (int slot = 0; slot < model.slots_made(c); ++slot) {  // each slot's first B
          const Tensor in = model.chunk_input(c, slot);           // (a later chunk's: zeros)
          if (!layout[size_t(c)].first) std::fill(in.f32(), in.f32() + in.numel(), 0.0f);
          model.forward_chunk(c, slot, ids.data(), ids.data(), 1.0f);
          model.backward_chunk_input(c, slot, d_output);
          model.backward_chunk_weights(c, slot, false);
        }
      }
      // Written over the activations, the kept gradients need no arena (but recompute's).
      if (!cfg.model.recompute) {
        EXPECT_EQ(model.deferred_bytes(), 0u);
      } else {
        EXPECT_GT(model.deferred_bytes(), 0u);
      }
      const MemoryEstimate e = estimate_memory(cfg, mesh, stage);
      // (Less the tied head's gradient zb-v keeps apart on the first stage: an arena of
      // its own, not an activation the model declares.)
      const bool apart = spec.placement().vee && cfg.model.tie_embeddings && stage == 0;
      const double table = 4.0 * double(cfg.model.vocab_size * cfg.model.d_model) / tp_degree;
      expect_the_models_activations(model, e.activations - e.dispatch - (apart ? table : 0));
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

}  // namespace
