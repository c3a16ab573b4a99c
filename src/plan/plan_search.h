#pragma once
// `pentad plan --ranks N`: every layout of N ranks that the recipe's checks accept and whose
// memory plan fits, each with its predicted step (plan/cost_model.h), ranked. docs/plan.md.
#include <map>
#include <string>
#include <vector>

#include "plan/cost_model.h"

namespace pentad {

// One layout: the recipe keys the search chooses.
struct Layout {
  int64_t tp = 1, d2 = 1, cp = 1, cp_ulysses = 1, pp = 1, dp = 1, vp = 1, pp_group = 2;
  int64_t micro_batch = 1, grad_accum = 1, ep = 1, etp = 1, zero = 0, tp_chunks = 1;
  std::string tp_order = "row", cp_impl = "ring", schedule = "1f1b", offload = "none";
  // parallel.pp_layout: "" keeps the recipe's; "balanced" where its layers do not split
  // evenly into the chunks and the recipe names no cut.
  std::string pp_layout;
  bool sp = false, recompute = false;

  // The overrides that make a recipe use it ("parallel.tp=2", ...), in recipe key order.
  std::vector<std::string> overrides() const;
  void apply(Config& cfg) const;
  // "tp2 sp | cp1 | pp2 1f1b | dp2 | mb2 x4 | z1" (fields at their one-rank value left out).
  std::string label() const;
};

// --layout "tp=8,pp=4,dp=32,vp=2,mb=1,...": the fields fixed, by name. pentad::Error naming
// --layout and the field when a field is unknown, not a value, or (for the degrees) does not
// divide the ranks.
std::map<std::string, std::string> parse_layout(const std::string& spec, int ranks);
// The field names --layout takes, for messages and help.
std::string layout_fields();

struct PlanRow {
  Layout layout;
  Prediction prediction;
};
struct PlanSearch {
  std::vector<PlanRow> rows;  // fitting layouts, fastest first
  int64_t considered = 0;     // layouts enumerated
  int64_t refused = 0;        // by the recipe's and the mesh's checks
  int64_t over_memory = 0;    // accepted, but over the memory limit
  int64_t pruned = 0;         // groups of layouts refused whole (a mesh shape, a schedule, ...)
  double global_batch = 0;    // sequences per step, kept at the recipe's
};

// Searches the layouts of `ranks` ranks with `fixed` fields (parse_layout), keeping the
// recipe's global batch (micro_batch x grad_accum x dp of its own layout on `ranks`). Throws
// pentad::Error when none is accepted (with the reason of one refusal) or none fits
// (naming the least memory any needs and its layout).
// The layouts inside each set of degrees are searched on `threads` threads (0: one a core of
// this machine); the result does not depend on how many.
PlanSearch search_layouts(const Config& recipe, int ranks,
                          const std::map<std::string, std::string>& fixed,
                          double memory_limit_bytes, const Machine& machine,
                          const parallel::Topology& topology, int threads = 0);

// The ranked table (top `top` rows) and the winner's recipe overrides.
std::string describe_plan(const PlanSearch& plan, const Machine& machine, int top);
// Every row as JSON: layout, step_seconds, tokens_per_second, flops_per_device, mfu,
// memory_bytes.
std::string plan_json(const PlanSearch& plan, const Machine& machine);

}  // namespace pentad
