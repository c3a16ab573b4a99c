// parallel.tp_shape = "auto" (train/cost_model.h, choose_tp_shape): the shape and order
// whose tp collectives take least time over the links of a topology.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/check.h"
#include "parallel/topology.h"
#include "train/cost_model.h"
#include "train/layout.h"
#include "train/recipe.h"

using namespace pentad;

namespace {

// The message of the pentad::Error f throws ("" if none).
template <typename F>
std::string tp_shape_refusal(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

Config tp8(std::vector<std::string> more = {}) {
  std::vector<std::string> overrides = {"parallel.tp=8", "model.d_model=512", "model.n_head=8"};
  overrides.insert(overrides.end(), more.begin(), more.end());
  return load_recipe(std::string(PENTAD_SOURCE_DIR) + "/recipes/gpt-tiny.toml", overrides);
}

TEST(TpShape, SlowLinksBetweenNodesGoAlongD1) {
  // Two nodes of 4: 100 GB/s inside, 1 GB/s between. Row-first 2x4 keeps each hidden group
  // (the d2 ranks, which carry the most) inside a node and sends 1/4 of 1D's bytes across.
  const Config cfg = tp8();
  parallel::MeshConfig mesh = mesh_config(cfg, 8);
  const parallel::Topology two_nodes = parallel::uniform_cluster(2, 4, 100.0, 1e-6, 1.0, 5e-6);
  const TpShapeChoice uneven = choose_tp_shape(cfg, mesh, two_nodes);
  EXPECT_EQ(uneven.describe(8), "2x4 row") << uneven.candidates;
  EXPECT_LT(uneven.seconds, 0.5 * uneven.one_d_seconds) << uneven.candidates;
  // One node, even links, bandwidth-bound: 1D moves the fewest bytes (7 n C a layer against
  // 8.5 n C for 4x2). (With 1 us a ring step instead, 4x2's fewer steps win by 7%.)
  const parallel::Topology one_node = parallel::uniform_cluster(1, 8, 100.0, 1e-8, 100.0, 1e-8);
  const TpShapeChoice even = choose_tp_shape(cfg, mesh, one_node);
  EXPECT_EQ(even.describe(8), "8x1") << even.candidates;
}

TEST(TpShape, AutoNeedsATopologyOfThisJob) {
  const std::string no_file =
      tp_shape_refusal([] { mesh_config(tp8({"parallel.tp_shape=auto"}), 8); });
  EXPECT_NE(no_file.find("parallel.topology"), std::string::npos) << no_file;
  const std::string bad = tp_shape_refusal([] { mesh_config(tp8({"parallel.tp_shape=3x3"}), 8); });
  EXPECT_NE(bad.find("3 x 3 = 9 but parallel.tp = 8"), std::string::npos) << bad;
  const std::string chunks =
      tp_shape_refusal([] { mesh_config(tp8({"parallel.tp_chunks=2"}), 8); });
  EXPECT_NE(chunks.find("parallel.tp_chunks = 2"), std::string::npos) << chunks;
}

}  // namespace
