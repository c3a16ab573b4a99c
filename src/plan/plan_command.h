#pragma once
// `pentad plan`: the memory plan of a recipe's own layout, or (with --ranks) the layout
// search with predicted step times (plan/plan_search.h), and `--calibrate`.
#include <string>
#include <vector>

namespace pentad {

struct PlanArgs {
  std::string recipe;
  std::vector<std::string> overrides;
  int64_t ranks = 0;              // 0: the recipe's own layout, memory plan only
  std::string topology;           // a `pentad probe` file
  std::string cluster;            // "dgx-h100[:NODES]"
  std::string engine = "pentad";  // whose implementation is predicted (plan/cost_model.h)
  double memory_gb = 0;           // per rank; 0: the machine's
  int top = 10;
  bool json = false;
  std::string write;   // recipe with the best layout
  std::string layout;  // fixed fields
  int after_loss = 0;  // with --ranks: the best layout, then after losing this many ranks
  bool calibrate = false;
  std::string calibration;  // file; empty: default_calibration_path()
};

// Prints on rank 0 only (`print`); throws pentad::Error naming the option on bad input.
void plan_command(const PlanArgs& args, bool print);

}  // namespace pentad
