#pragma once
// What a recipe asks of the hardware and the ranks, read from its Config: the placement
// (device, compute type), the device mesh and the pipeline schedule. The trainer, the
// memory budget and the launcher (launch/) read them here.
#include <cstdint>
#include <string>
#include <vector>

#include "core/params.h"
#include "parallel/mesh.h"
#include "parallel/pp/schedule.h"
#include "recipe/config.h"

namespace pentad {

// The placement (device, compute type) a recipe asks for.
Placement placement(const Config& cfg);

// parallel.tp_shape's d2 (1: Megatron's 1D tp); pentad::Error naming the key if it is not
// "d1xd2" with d1 x d2 = tp and d2 dividing model.d_model.
int tp_shape_d2(const Config& cfg);
// The mesh a recipe asks for on `world_size` ranks (dp = 0 takes what is left), checked
// against the model: refusals name the degree to change. parallel.tp_shape = "auto" reads
// parallel.topology and picks the shape (choose_tp_shape); `note` then says which and why.
parallel::MeshConfig mesh_config(const Config& cfg, int world_size, std::string* note = nullptr);

// train.global_batch, when set, on `dp` data-parallel ranks: sets train.grad_accum to
// global_batch / (micro_batch x dp), so that every layout takes the same sequences a step.
// Refuses (pentad::Error naming the keys) a layout that does not divide it. Idempotent.
void apply_global_batch(Config& cfg, int dp);

// The layers of each pipeline chunk (p * v, in model order) of cfg on `stages` stages:
// parallel.pp_layout's counts, an even split, or "balanced" by each layer's and the head's
// training FLOPs (model/model.h; the embedding's lookup counts none), so that the last chunk,
// which also runs the head and the loss, takes fewer layers where the head outweighs one.
// Every place that cuts the model (the trainer, the memory plan, the planner) cuts it here.
std::vector<int64_t> pipeline_chunk_layers(const Config& cfg, int stages);
// What "balanced" weighs: each layer's training FLOPs a token, and the head's on the last
// chunk.
parallel::pp::LayerCosts pipeline_layer_costs(const Config& cfg);

// The pipeline schedule a recipe asks for (parallel.pp_schedule over train.grad_accum).
parallel::pp::ScheduleSpec schedule_spec(const Config& cfg);
// The same on `mesh`, as the stages run it: zb-h1 with its held limits where the stages'
// activations differ (zero_bubble_held_limits over stage_slot_bytes and stage_head_bytes). What the
// trainer runs, the memory plan counts and the planner predicts.
parallel::pp::ScheduleSpec schedule_spec(const Config& cfg, const parallel::MeshConfig& mesh);

}  // namespace pentad
