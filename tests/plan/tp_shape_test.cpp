// parallel.tp_shape = "auto" (plan/cost_model.h, choose_tp_shape): the shape and order
// whose tp collectives take least time over the links of a topology.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/check.h"
#include "parallel/topology.h"
#include "plan/cost_model.h"
#include "plan/layout.h"
#include "recipe/recipe.h"

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

// Issue 45: tp above the head count chose 1D, the cheapest on even links, and the layout then
// refused it with the 1D rule only, though 4x2 splits the 4 heads over d1 = 4.
TEST(TpShape, AutoSkipsShapesTheModelRefusesAndStatesBothRules) {
  const parallel::Topology one_node = parallel::uniform_cluster(1, 8, 100.0, 1e-8, 100.0, 1e-8);
  const Config four_heads = tp8({"model.n_head=4"});
  parallel::MeshConfig mesh = mesh_config(tp8(), 8);
  const TpShapeChoice fits = choose_tp_shape(four_heads, mesh, one_node);
  EXPECT_EQ(fits.d2, 2) << fits.candidates;
  EXPECT_NE(fits.candidates.find("8x1 does not split the model"), std::string::npos)
      << fits.candidates;
  // Two heads of width 5: 1D, 4x2 split the heads over more ranks than there are; 2x4, 1x8 cut
  // d_model = 10 into 4 or 8.
  const Config none = tp8({"model.n_head=2", "model.d_model=10"});
  const std::string why = tp_shape_refusal([&] { choose_tp_shape(none, mesh, one_node); });
  for (const char* words :
       {"parallel.tp_shape = \"auto\" finds no shape of parallel.tp = 8",
        "1D (8x1) splits the heads, kv heads and MLP width over all of tp: tp 8 does not divide "
        "model.n_head = 2",
        "2D (d1 x d2) splits them over d1 and model.d_model over d2: 4x2: the 2D tp shape 4x2 "
        "splits model.n_head = 2 over d1 = 4",
        "2x4: the 2D tp shape 2x4 splits model.d_model = 10 over d2 = 4", "1x8: "})
    EXPECT_NE(why.find(words), std::string::npos) << words << "\n" << why;
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

// Issue 45: pp = 4 on 6 ranks said "change parallel.tp", a key the recipe had left at 1.
TEST(MeshConfig, ARankCountThatDoesNotDivideNamesTheKeysSet) {
  const std::string gpt = std::string(PENTAD_SOURCE_DIR) + "/recipes/gpt-tiny.toml";
  const std::string pp4 =
      tp_shape_refusal([&] { mesh_config(load_recipe(gpt, {"parallel.pp=4"}), 6); });
  EXPECT_NE(pp4.find("parallel.pp (4) = 4 does not divide the 6 ranks started: change "
                     "parallel.pp to 1, 2, 3 or 6, or start a multiple of 4 ranks"),
            std::string::npos)
      << pp4;
  EXPECT_EQ(pp4.find("change parallel.tp"), std::string::npos) << pp4;
  const std::string both = tp_shape_refusal([&] {
    mesh_config(load_recipe(gpt, {"parallel.tp=2", "parallel.pp=2"}), 6);
  });
  EXPECT_NE(both.find("change parallel.tp to 1 or 3, or change parallel.pp to 1 or 3"),
            std::string::npos)
      << both;
}

}  // namespace
