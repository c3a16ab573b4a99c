#pragma once
// What the sources of plan_tests' planner checks share (plan_test.cpp: the cost model;
// plan_search_test.cpp: the layout search and its refusals; plan_cpu_test.cpp: CPU nodes and
// the kernel table): a small GPT-2 recipe, one H100 node and its links, and a prediction on
// them.
#include <string>
#include <vector>

#include "parallel/topology.h"
#include "plan/cost_model.h"
#include "plan/layout.h"
#include "recipe/recipe.h"

namespace pentad::plan_test_util {

// A GPT-2 shape small enough to plan in milliseconds, wide enough for tp 8 and 2D shapes.
inline Config gpt(std::vector<std::string> overrides = {}) {
  const std::string toml = R"(
[model]
family = "gpt2"
n_layer = 4
d_model = 1024
n_head = 16
vocab_size = 32768
max_seq_len = 1024
[train]
seq_len = 1024
micro_batch = 1
grad_accum = 8
eval_every = 0
precision = "bf16"
device = "cuda"
)";
  return parse_recipe(toml, "plan_test.toml", overrides);
}

inline Machine h100() {
  return cluster_preset("dgx-h100", 8).machine;
}

// One H100 node's links (the dgx-h100 preset's NVSwitch figures).
inline parallel::Topology nvswitch() {
  return parallel::uniform_cluster(1, 8, 450, 3e-6, 450, 3e-6);
}

inline Prediction predict(const Config& cfg, const parallel::Topology& topo) {
  return predict_step(cfg, mesh_config(cfg, 8), h100(), topo);
}

}  // namespace pentad::plan_test_util
