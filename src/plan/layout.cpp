#include "plan/layout.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/param_table.h"
#include "parallel/pp/layout.h"
#include "parallel/pp/pipeline.h"
#include "parallel/topology.h"
#include "plan/cost_model.h"
#include "plan/memory_budget.h"

namespace pentad {

Placement placement(const Config& cfg) {
  Placement p;
  p.device = cfg.train.device == "cuda" ? Device::CUDA : Device::CPU;
  p.compute = cfg.train.precision == "bf16" ? DType::BF16 : DType::F32;
  return p;
}

parallel::pp::ScheduleSpec schedule_spec(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  parallel::pp::ScheduleSpec spec;
  // "adaptive" runs kFkB and re-chooses its group as it goes.
  spec.kind = p.pp_schedule == "adaptive" ? parallel::pp::ScheduleKind::KFKB
                                          : parallel::pp::parse_schedule(p.pp_schedule);
  spec.stages = int(p.pp);
  spec.micro_batches = int(cfg.train.grad_accum);
  spec.virtual_stages = int(p.virtual_stages);
  spec.group = int(std::min(p.pp_group, cfg.train.grad_accum));
  return spec;
}

parallel::pp::ScheduleSpec schedule_spec(const Config& cfg, const parallel::MeshConfig& mesh) {
  parallel::pp::ScheduleSpec spec = schedule_spec(cfg);
  if (spec.kind == parallel::pp::ScheduleKind::ZBH1 && mesh.pp > 1)
    spec.zb_held_limits = parallel::pp::zero_bubble_held_limits(stage_slot_bytes(cfg, mesh),
                                                                stage_head_bytes(cfg, mesh));
  return spec;
}

void apply_global_batch(Config& cfg, int dp) {
  TrainConfig& t = cfg.train;
  if (t.global_batch <= 0) return;
  const int64_t round = t.micro_batch * dp;  // sequences of one micro-batch on every dp rank
  if (t.global_batch % round != 0)
    fail(
        "train.global_batch = {} is not a multiple of train.micro_batch ({}) x dp ({}) = {}: "
        "set train.global_batch to a multiple of {} (e.g. {}), or change train.micro_batch or "
        "the data-parallel degree (parallel.dp, the ranks started)",
        t.global_batch, t.micro_batch, dp, round, round,
        std::max<int64_t>(1, t.global_batch / round) * round);
  t.grad_accum = t.global_batch / round;
}

int tp_shape_d2(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  if (p.tp_shape.empty()) {
    if (p.tp_chunks > 1)
      fail(
          "parallel.tp_chunks = {} pipelines 2D tp's collectives with its GEMMs: set "
          "parallel.tp_shape to a 2D shape (\"d1xd2\") or tp_chunks = 1",
          p.tp_chunks);
    return 1;
  }
  if (p.tp_shape == "auto") {
    if (p.topology.empty())
      fail(
          "parallel.tp_shape = \"auto\" needs a measured topology: run `pentad probe` and set "
          "parallel.topology to its file");
    return 0;  // chosen by mesh_config once the mesh is known
  }
  int64_t d1 = 0, d2 = 0;
  char x = 0, rest = 0;
  if (std::sscanf(p.tp_shape.c_str(), "%ld%c%ld%c", &d1, &x, &d2, &rest) != 3 || x != 'x' ||
      d1 < 1 || d2 < 1)
    fail("parallel.tp_shape = \"{}\" is not \"d1xd2\" (e.g. \"2x2\") or \"auto\"", p.tp_shape);
  if (d1 * d2 != p.tp)
    fail(
        "parallel.tp_shape = \"{}\": {} x {} = {} but parallel.tp = {}: set a shape whose "
        "product is tp, or tp = {}",
        p.tp_shape, d1, d2, d1 * d2, p.tp, d1 * d2);
  if (p.tp_chunks > 1 && d2 == 1)
    fail(
        "parallel.tp_chunks = {} pipelines 2D tp's collectives with its GEMMs, but "
        "parallel.tp_shape = \"{}\" is 1D: set tp_chunks = 1 or a 2D shape",
        p.tp_chunks, p.tp_shape);
  return static_cast<int>(d2);
}

namespace {

// For tp x cp x pp that does not divide the world: each of the three set above 1, with the
// values that would make the product divide it, the others kept ("change parallel.pp to 1, 2,
// 3 or 6").
std::string product_fixes(const ParallelConfig& p, int world_size) {
  const std::pair<const char*, int64_t> keys[] = {
      {"parallel.tp", p.tp}, {"parallel.cp", p.cp}, {"parallel.pp", p.pp}};
  std::vector<std::string> fixes;
  for (const auto& [key, value] : keys) {
    if (value == 1) continue;
    const int64_t rest = p.tp * p.cp * p.pp / value;
    std::vector<int64_t> fit;
    for (int64_t v = 1; v * rest <= world_size; ++v)
      if (world_size % (v * rest) == 0) fit.push_back(v);
    if (fit.empty()) continue;
    std::string values = std::to_string(fit[0]);
    for (size_t i = 1; i < fit.size(); ++i)
      values += (i + 1 == fit.size() ? " or " : ", ") + std::to_string(fit[i]);
    fixes.push_back(fmt::format("change {} to {}", key, values));
  }
  if (fixes.empty()) return "change parallel.tp, parallel.cp or parallel.pp";
  std::string text = fixes[0];
  for (size_t i = 1; i < fixes.size(); ++i) text += ", or " + fixes[i];
  return text;
}

}  // namespace

parallel::MeshConfig mesh_config(const Config& cfg, int world_size, std::string* note) {
  const ParallelConfig& p = cfg.parallel;
  parallel::MeshConfig mesh;
  mesh.tp = static_cast<int>(p.tp);
  mesh.cp = static_cast<int>(p.cp);
  mesh.cp_ulysses = p.cp_impl == "ulysses"  ? mesh.cp
                    : p.cp_impl == "hybrid" ? static_cast<int>(p.cp_ulysses)
                                            : 1;
  mesh.pp = static_cast<int>(p.pp);
  mesh.ep = static_cast<int>(p.ep);
  mesh.etp = static_cast<int>(p.etp);
  mesh.order = p.order;
  const int d2 = tp_shape_d2(cfg);
  mesh.tp_d2 = std::max(d2, 1);
  mesh.tp_column_first = p.tp_order == "column";
  mesh.pp_vee = p.pp_schedule == "zb-v";
  const int64_t others = p.tp * p.cp * p.pp;
  if (p.dp > 0)
    mesh.dp = static_cast<int>(p.dp);
  else if (world_size % others == 0)
    mesh.dp = static_cast<int>(world_size / others);
  else
    fail(
        "parallel.tp ({}) x parallel.cp ({}) x parallel.pp ({}) = {} does not divide the {} "
        "ranks started: {}, or start a multiple of {} ranks",
        p.tp, p.cp, p.pp, others, world_size, product_fixes(p, world_size), others);
  // MoE Parallel Folding re-splits a pipeline stage's ranks into edp x ep x etp.
  const int64_t stage_ranks = int64_t(mesh.dp) * mesh.cp * mesh.tp, expert = p.ep * p.etp;
  if (stage_ranks % expert != 0)
    fail(
        "parallel.ep ({}) x parallel.etp ({}) = {} must divide the {} ranks of a pipeline stage "
        "(dp {} x cp {} x tp {}): change parallel.ep or parallel.etp so that their product is a "
        "divisor of {}, or start more ranks",
        p.ep, p.etp, expert, stage_ranks, mesh.dp, mesh.cp, mesh.tp, stage_ranks);
  parallel::validate(mesh, world_size);
  if (d2 == 0) {  // "auto": the shape and order whose tp collectives take least time
    const parallel::Topology topology = parallel::Topology::read(p.topology);
    topology.check_ranks(world_size, p.topology);
    const TpShapeChoice best = choose_tp_shape(cfg, mesh, topology);
    mesh.tp_d2 = best.d2;
    mesh.tp_column_first = best.column_first;
    if (note)
      *note = fmt::format(
          "tp shape: {}, the least time predicted for one layer's tp collectives over {} "
          "(forward and backward: {})",
          best.describe(mesh.tp), p.topology, best.candidates);
  }
  // Every rank of an ep group takes part in each MoE layer's all-to-alls, and at ZeRO-3
  // every rank of dp x cp (edp) in each layer's parameter gather, so data-parallel ranks
  // must run the same number of eval micro-batches.
  const bool ep = p.ep > 1 || p.etp > 1, zero3 = p.zero == 3 && mesh.dp > 1;
  if ((ep || zero3) && cfg.train.eval_every > 0 && cfg.train.eval_batches % mesh.dp != 0)
    fail(
        "train.eval_batches ({}) must be a multiple of the data-parallel degree ({}) with {}: "
        "{} must evaluate as many batches; set train.eval_batches = {}",
        cfg.train.eval_batches, mesh.dp,
        ep ? fmt::format("expert parallelism (parallel.ep = {}, parallel.etp = {})", p.ep, p.etp)
           : std::string("parallel.zero = 3"),
        ep ? "every rank of an ep group"
           : "the data-parallel ranks, which gather each layer's parameters together,",
        (cfg.train.eval_batches + mesh.dp - 1) / mesh.dp * mesh.dp);
  if (p.pp > 1 || p.virtual_stages > 1 || !p.pp_layout.empty()) {
    Config resolved = cfg;  // the schedule runs the micro-batches train.global_batch implies
    apply_global_batch(resolved, mesh.dp);
    const parallel::pp::ScheduleSpec spec = schedule_spec(resolved);
    parallel::pp::check_schedule(spec);
    pipeline_chunk_layers(cfg, int(p.pp));
  }
  parallel::check_layout(mesh, cfg.model.d_model, cfg.model.n_head, cfg.model.n_kv_head,
                         cfg.model.vocab_size, ffn_dim(cfg.model), cfg.model.n_layer,
                         cfg.train.seq_len, cfg.train.micro_batch, p.sequence_parallel);
  return mesh;
}

parallel::pp::LayerCosts pipeline_layer_costs(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  parallel::pp::LayerCosts costs;
  const std::vector<int64_t> moe = m.is_moe() ? moe_layer_indices(m) : std::vector<int64_t>{};
  // A layer's cost depends only on its kind (the planner asks this of every layout it ranks).
  const double keys = double(cfg.train.seq_len);
  const double dense = layer_flops_per_token(m, false, keys);
  const double routed = moe.empty() ? dense : layer_flops_per_token(m, true, keys);
  for (int64_t l = 0; l < m.n_layer; ++l)
    costs.layers.push_back(std::find(moe.begin(), moe.end(), l) != moe.end() ? routed : dense);
  costs.last = head_flops_per_token(m);
  return costs;
}

std::vector<int64_t> pipeline_chunk_layers(const Config& cfg, int stages) {
  const ParallelConfig& p = cfg.parallel;
  const ModelConfig& m = cfg.model;
  if (p.pp_layout != "balanced")
    return parallel::pp::chunk_layers(m.n_layer, stages, int(p.virtual_stages), p.pp_layout);
  // The planner asks for many layouts of one model: each thread keeps the cuts of the last
  // model (its shared parameter table) and sequence length.
  thread_local std::shared_ptr<const ParamTable> model;
  thread_local int64_t seq_len = -1;
  thread_local std::map<std::pair<int, int64_t>, std::vector<int64_t>> cuts;
  std::shared_ptr<const ParamTable> table = shared_param_table(m);
  if (table != model || seq_len != cfg.train.seq_len) {
    cuts.clear();
    model = std::move(table);
    seq_len = cfg.train.seq_len;
  }
  auto it = cuts.find({stages, p.virtual_stages});
  if (it == cuts.end()) {
    const parallel::pp::LayerCosts costs = pipeline_layer_costs(cfg);
    it = cuts.emplace(std::make_pair(stages, p.virtual_stages),
                      parallel::pp::chunk_layers(m.n_layer, stages, int(p.virtual_stages),
                                                 p.pp_layout, &costs))
             .first;
  }
  return it->second;
}

}  // namespace pentad
