// The planner's cost model (plan/cost_model.h): the volumes of tensor parallelism's
// collectives, the FLOP count it shares with the model, the gradient bucket left after
// backward, tied embeddings summed between the pipeline's ends, another engine's overlaps,
// and a ranking that flips between 1D and 2D tensor parallelism with the topology.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/model.h"
#include "parallel/topology.h"
#include "plan/cost_model.h"
#include "plan/layout.h"
#include "plan/memory_budget.h"
#include "plan/plan_search.h"
#include "plan_test_util.h"
#include "recipe/recipe.h"

using namespace pentad;

namespace plan_test {

using pentad::plan_test_util::gpt;
using pentad::plan_test_util::h100;
using pentad::plan_test_util::nvswitch;
using pentad::plan_test_util::predict;

TEST(Plan, OneDimensionalTensorParallelVolumes) {
  // n = 1024 rows, C = 1024, bf16: two all-reduces of n C e forward, two backward; with
  // sequence parallelism each an all-gather and a reduce-scatter of the same volume.
  const double ncE = 1024.0 * 1024 * 2;
  Config cfg = gpt({"parallel.tp=4", "parallel.dp=2"});
  const parallel::MeshConfig mesh = mesh_config(cfg, 8);
  for (bool backward : {false, true}) {
    const auto calls = tp_layer_collectives(cfg, mesh, backward);
    ASSERT_EQ(calls.size(), 2u);
    for (const CollectiveCall& c : calls) {
      EXPECT_EQ(c.op, parallel::CollectiveOp::AllReduce);
      EXPECT_DOUBLE_EQ(c.bytes, ncE);
      EXPECT_EQ(c.group, (std::vector<int>{0, 1, 2, 3}));
    }
  }
  cfg = gpt({"parallel.tp=4", "parallel.dp=2", "parallel.sequence_parallel=true"});
  const auto sp = tp_layer_collectives(cfg, mesh_config(cfg, 8), false);
  ASSERT_EQ(sp.size(), 4u);
  EXPECT_EQ(sp[0].op, parallel::CollectiveOp::AllGather);
  EXPECT_EQ(sp[1].op, parallel::CollectiveOp::ReduceScatter);
  for (const CollectiveCall& c : sp) EXPECT_DOUBLE_EQ(c.bytes, ncE);
}

TEST(Plan, TwoDimensionalTensorParallelVolumesAndGroups) {
  // tp 4 = 2 x 2, row order: the d2 group of tp rank 0 is {0, 1} (adjacent), its d1 group
  // {0, 2}. Forward: qkv all-reduce over d2 of n (3C)/d1 e; o: all-reduce over d1 of
  // n C/d2 e and all-gather over d2 of n C e; up: n 4C/d1 e over d2; down as o.
  const double n = 1024, C = 1024, e = 2;
  Config cfg = gpt({"parallel.tp=4", "parallel.dp=2", "parallel.tp_shape=\"2x2\""});
  const auto fwd = tp_layer_collectives(cfg, mesh_config(cfg, 8), false);
  ASSERT_EQ(fwd.size(), 6u);
  EXPECT_EQ(fwd[0].group, (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(fwd[0].bytes, n * 3 * C / 2 * e);
  EXPECT_EQ(fwd[1].op, parallel::CollectiveOp::AllReduce);
  EXPECT_EQ(fwd[1].group, (std::vector<int>{0, 2}));
  EXPECT_DOUBLE_EQ(fwd[1].bytes, n * C / 2 * e);
  EXPECT_EQ(fwd[2].op, parallel::CollectiveOp::AllGather);
  EXPECT_DOUBLE_EQ(fwd[2].bytes, n * C * e);
  EXPECT_DOUBLE_EQ(fwd[3].bytes, n * 4 * C / 2 * e);
  // Backward: down's input gradient over d2 (n F/d1 e), then up's over d1 and d2, ...
  const auto bwd = tp_layer_collectives(cfg, mesh_config(cfg, 8), true);
  ASSERT_EQ(bwd.size(), 6u);
  EXPECT_DOUBLE_EQ(bwd[0].bytes, n * 4 * C / 2 * e);
  EXPECT_DOUBLE_EQ(bwd[3].bytes, n * C / 2 * e);
  // Column order: the d1 group is adjacent.
  cfg = gpt({"parallel.tp=4", "parallel.dp=2", "parallel.tp_shape=\"2x2\"",
             "parallel.tp_order=\"column\""});
  const auto col = tp_layer_collectives(cfg, mesh_config(cfg, 8), false);
  EXPECT_EQ(col[0].group, (std::vector<int>{0, 2}));
  EXPECT_EQ(col[1].group, (std::vector<int>{0, 1}));
  // Chunks hide (chunks - 1) / chunks of the 2D collectives.
  cfg =
      gpt({"parallel.tp=4", "parallel.dp=2", "parallel.tp_shape=\"2x2\"", "parallel.tp_chunks=4"});
  EXPECT_DOUBLE_EQ(tp_layer_collectives(cfg, mesh_config(cfg, 8), false)[0].hidden, 0.75);
}

TEST(Plan, FlopsCountedAsTheModelCountsThem) {
  const Config cfg = gpt();
  const double C = 1024, F = 4 * C, T = 1024;
  // 6 x (q,k,v,o + MLP + causal attention) per token; the head 6 V C.
  EXPECT_DOUBLE_EQ(layer_flops_per_token(cfg.model, false, T),
                   6 * (2 * C * C + 2 * C * C + C * T + 2 * C * F));
  EXPECT_DOUBLE_EQ(head_flops_per_token(cfg.model), 6 * 32768 * C);
  // The prediction's model FLOP/s per device times its step and ranks: every token's flops.
  const Config one = gpt({"parallel.dp=8"});
  const Prediction p = predict(one, parallel::uniform_cluster(1, 8, 450, 3e-6, 450, 3e-6));
  const double tokens = 1024.0 * 8 * 8;
  EXPECT_NEAR(
      p.flops_per_device * p.step_seconds * 8,
      tokens * (4 * layer_flops_per_token(cfg.model, false, T) + head_flops_per_token(cfg.model)),
      1.0);
  EXPECT_GT(p.mfu, 0.05);
  EXPECT_LT(p.mfu, 0.74);
}

// A head that outweighs layers (vocabulary 65536 at width 1024: about 4.9 layers' FLOPs) makes
// the last stage the pipeline's slowest under an even split (4 layers and the head: 8.9
// layers' worth); "balanced" gives it one layer (5.9) and the others five, and the prediction
// follows, through the same cut the trainer makes (pipeline_chunk_layers).
TEST(Plan, BalancedPipelineChunksEvenTheHeadsStage) {
  const std::vector<std::string> keys = {"model.n_layer=16", "model.vocab_size=65536",
                                         "parallel.pp=4", "parallel.dp=2"};
  const Config even = gpt(keys);
  std::vector<std::string> with = keys;
  with.push_back("parallel.pp_layout=\"balanced\"");
  const Config balanced = gpt(with);
  EXPECT_EQ(pipeline_chunk_layers(even, 4), (std::vector<int64_t>{4, 4, 4, 4}));
  EXPECT_EQ(pipeline_chunk_layers(balanced, 4), (std::vector<int64_t>{5, 5, 5, 1}));
  const Prediction a = predict(even, nvswitch()), b = predict(balanced, nvswitch());
  EXPECT_LT(b.compute, 0.75 * a.compute);
  EXPECT_LT(b.step_seconds, 0.85 * a.step_seconds);
}

// The gradient bucket left after backward is the embedding's, whole (a bucket never splits a
// parameter, and the embedding's gradient is final last): 32768 x 1024 + GPT-2's 1024 x 1024
// positions, 136 MB of fp32, far beyond bucket_mb's 4 MiB. On NVSwitch the rest hides behind
// the layers' backward at 4 sequences a micro-batch (the head's backward runs in the forward,
// before any gradient is reduced); that one reduction cannot.
TEST(Plan, TheEmbeddingsBucketIsWaitedForWhole) {
  const parallel::Topology topo = nvswitch();
  const Prediction p = predict(gpt({"parallel.dp=8", "train.micro_batch=4"}), topo);
  const double embedding = 4.0 * (32768 + 1024) * 1024;
  const std::vector<int> all{0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_NEAR(p.dp, topo.collective_seconds(parallel::CollectiveOp::AllReduce, all, embedding),
              1e-12);
}

// Tied embeddings under pipelining: the first and last stages sum their tables' gradients
// after the reduction, over the link between them (here across two nodes, the dp groups
// inside one): the dp part pays it, untied it does not.
TEST(Plan, TiedEmbeddingsAreSummedBetweenTheEnds) {
  auto dp_part = [](const Config& cfg, double inter_gbs) {
    return predict(cfg, parallel::uniform_cluster(2, 4, 450, 3e-6, inter_gbs, 5e-6)).dp;
  };
  const Config tied = gpt({"parallel.pp=2", "parallel.dp=4"});
  const double table = 4.0 * double(tied.model.vocab_size * tied.model.d_model);
  EXPECT_GT(dp_part(tied, 1) - dp_part(tied, 1000), 0.9 * table / 1e9);
  const Config untied = gpt({"parallel.pp=2", "parallel.dp=4", "model.tie_embeddings=false"});
  EXPECT_NEAR(dp_part(untied, 1), dp_part(untied, 1000), 1e-12);
}
// `--engine megatron-core` predicts what Megatron-Core overlaps and pentad does not (yet); the
// compute is the same. With sequence parallelism its 1D tp collectives are pipelined with
// the GEMMs: less than pentad's waited-for collectives, never less than one piece of tp.
// Without sp they are pentad's. Its ZeRO-1 parameter gather sends bf16, not fp32, and hides
// behind the first forward: at least the bytes saved go, and at most the whole fp32 gather
// less its first bucket's.
TEST(Plan, MegatronCoresEngineHidesWhatItOverlaps) {
  Machine theirs = h100();
  theirs.engine = engine_named("megatron-core");
  const parallel::Topology topo = nvswitch();
  const Config tp8 = gpt({"parallel.tp=8", "parallel.sequence_parallel=true"});
  const Prediction ours_tp = predict(tp8, topo);
  const Prediction their_tp = predict_step(tp8, mesh_config(tp8, 8), theirs, topo);
  EXPECT_DOUBLE_EQ(their_tp.compute, ours_tp.compute);
  EXPECT_LT(their_tp.tp, 0.9 * ours_tp.tp);
  EXPECT_GE(their_tp.tp, ours_tp.tp / 8 * (1 - 1e-12));
  const Config no_sp = gpt({"parallel.tp=8", "parallel.sequence_parallel=false"});
  EXPECT_DOUBLE_EQ(predict_step(no_sp, mesh_config(no_sp, 8), theirs, topo).tp,
                   predict(no_sp, topo).tp);

  // dp 8 over two nodes of 4 (InfiniBand between them), ZeRO-1.
  const parallel::Topology nodes = parallel::uniform_cluster(2, 4, 450, 3e-6, 50, 6e-6);
  const Config dp8 = gpt({"parallel.dp=8", "parallel.zero=1"});
  const parallel::MeshConfig mesh = mesh_config(dp8, 8);
  const Prediction ours = predict_step(dp8, mesh, h100(), nodes);
  const Prediction their = predict_step(dp8, mesh, theirs, nodes);
  const double values = estimate_memory(dp8, mesh).values;
  const std::vector<int> all{0, 1, 2, 3, 4, 5, 6, 7};
  auto gather = [&](double bytes) {
    return nodes.collective_seconds(parallel::CollectiveOp::AllGather, all, bytes);
  };
  EXPECT_DOUBLE_EQ(their.compute, ours.compute);
  EXPECT_LE(their.dp, ours.dp - (gather(4 * values) - gather(2 * values)) * (1 - 1e-12));
  EXPECT_GE(their.dp, ours.dp - gather(4 * values) + gather(2 * 40e6) * (1 - 1e-12));
}

TEST(Plan, TwoDimensionalWinsOnlyOverUnevenLinks) {
  // tp 8 over two nodes of 4: 1D's all-reduces cross the slow link with n C e; the 2x4
  // shape keeps its d2 group (4 adjacent ranks) inside a node and sends a quarter of that
  // over the d1 group. On even links 1D's fewer, larger collectives and undivided compute win.
  const parallel::Topology even = parallel::uniform_cluster(1, 8, 450, 3e-6, 450, 3e-6);
  const parallel::Topology uneven = parallel::uniform_cluster(2, 4, 450, 3e-6, 5, 20e-6);
  const Config one_d = gpt({"parallel.tp=8"});
  const Config two_d = gpt({"parallel.tp=8", "parallel.tp_shape=\"2x4\""});
  EXPECT_LT(predict(one_d, even).step_seconds, predict(two_d, even).step_seconds);
  EXPECT_GT(predict(one_d, uneven).step_seconds, predict(two_d, uneven).step_seconds);
  // And the search, tp fixed at 8, ranks them accordingly: the best 1D layout above the best
  // 2x4 one over even links, below it over uneven ones.
  const auto fixed = parse_layout("tp=8,sp=false,zero=0,recompute=false,offload=none", 8);
  const Machine m = h100();
  auto first = [](const PlanSearch& plan, int64_t d2) {
    for (size_t i = 0; i < plan.rows.size(); ++i)
      if (plan.rows[i].layout.d2 == d2 && plan.rows[i].layout.tp_order == "row") return i;
    return plan.rows.size();
  };
  const PlanSearch on_even = search_layouts(one_d, 8, fixed, 80e9, m, even);
  const PlanSearch on_uneven = search_layouts(one_d, 8, fixed, 80e9, m, uneven);
  EXPECT_LT(first(on_even, 1), first(on_even, 4));
  EXPECT_GT(first(on_uneven, 1), first(on_uneven, 4));
}

}  // namespace plan_test
