#pragma once
// What the sources of plan_tests' memory estimate checks share (memory_budget_test.cpp: the
// estimate against a model's arenas; memory_budget_moe_zero_test.cpp: experts, ZeRO and
// offloads; memory_budget_refusal_test.cpp: the limit, the refusal and the machine's share):
// the shipped recipes' folder and a mesh of one rank.
#include <string>

#include "parallel/mesh.h"

namespace pentad::memory_budget_test_util {

inline const std::string kRecipes = std::string(PENTAD_SOURCE_DIR) + "/recipes/";

inline parallel::MeshConfig one_rank() {
  parallel::MeshConfig mesh;
  mesh.tp = mesh.cp = mesh.dp = mesh.pp = 1;
  return mesh;
}

}  // namespace pentad::memory_budget_test_util
