// The planner (plan/cost_model.h, plan/plan_search.h, plan/calibration.h): the volumes of
// tensor parallelism's collectives, the FLOP count it shares with the model, a ranking that
// flips between 1D and 2D tensor parallelism with the topology, the gradient bucket left
// after backward, a fixed layout predicted as is, another engine's overlaps, and the refusals.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "core/check.h"
#include "model/model.h"
#include "plan/calibration.h"
#include "plan/cost_model.h"
#include "plan/layout.h"
#include "plan/memory_budget.h"
#include "plan/plan_search.h"
#include "recipe/recipe.h"

using namespace pentad;

namespace plan_test {

// A GPT-2 shape small enough to plan in milliseconds, wide enough for tp 8 and 2D shapes.
Config gpt(std::vector<std::string> overrides = {}) {
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

Machine h100() {
  return cluster_preset("dgx-h100", 8).machine;
}

// One H100 node's links (the dgx-h100 preset's NVSwitch figures).
parallel::Topology nvswitch() {
  return parallel::uniform_cluster(1, 8, 450, 3e-6, 450, 3e-6);
}

Prediction predict(const Config& cfg, const parallel::Topology& topo) {
  return predict_step(cfg, mesh_config(cfg, 8), h100(), topo);
}

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

// The gradient bucket left after backward is the embedding's, whole (a bucket never splits a
// parameter, and the embedding's gradient is final last): 32768 x 1024 + GPT-2's 1024 x 1024
// positions, 136 MB of fp32, far beyond bucket_mb's 4 MiB. On NVSwitch the rest hides behind
// backward; that one reduction cannot.
TEST(Plan, TheEmbeddingsBucketIsWaitedForWhole) {
  const parallel::Topology topo = nvswitch();
  const Prediction p = predict(gpt({"parallel.dp=8"}), topo);
  const double embedding = 4.0 * (32768 + 1024) * 1024;
  const std::vector<int> all{0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_NEAR(p.dp, topo.collective_seconds(parallel::CollectiveOp::AllReduce, all, embedding),
              1e-12);
}

// `--engine megatron-core` predicts what Megatron-Core overlaps and pentad does not (yet); the
// compute is the same. With sequence parallelism its 1D tp collectives are pipelined with
// the GEMMs: less than pentad's waited-for collectives, never less than one piece of tp.
// Without sp they are pentad's. Its ZeRO-1 parameter gather sends bf16, not fp32, and hides
// behind the first forward: at least the bytes saved go, and at most the whole fp32 gather
// less its first bucket's.
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

TEST(Plan, AFixedLayoutIsPredictedAsIs) {
  const Config cfg = gpt({"parallel.dp=8"});
  const auto fixed = parse_layout(
      "tp=2,tp_shape=2x1,tp_order=row,tp_chunks=1,sp=true,cp=1,cp_impl=ring,pp=2,schedule=1f1b,"
      "vp=1,pp_group=2,dp=2,mb=2,ga=16,ep=1,etp=1,zero=1,offload=none,recompute=false",
      8);
  const PlanSearch plan = search_layouts(cfg, 8, fixed, 80e9, h100(),
                                         parallel::uniform_cluster(1, 8, 450, 3e-6, 450, 3e-6));
  ASSERT_EQ(plan.rows.size(), 1u);
  const Layout& l = plan.rows.front().layout;
  EXPECT_EQ(l.label(), "tp2 sp pp2 1f1b dp2 mb2 ga16 z1");
  // Its prediction is the cost model's for that recipe.
  Config applied = cfg;
  l.apply(applied);
  const Prediction direct = predict_step(applied, mesh_config(applied, 8), h100(),
                                         parallel::uniform_cluster(1, 8, 450, 3e-6, 450, 3e-6));
  EXPECT_DOUBLE_EQ(plan.rows.front().prediction.step_seconds, direct.step_seconds);
  EXPECT_DOUBLE_EQ(plan.global_batch, 64);  // the recipe's: 1 x 8 x dp 8
}

TEST(Plan, TheGlobalBatchKeyIsTheSearchsBatch) {
  // train.global_batch = 24 over 8 ranks: every layout takes 24 sequences a step, whatever
  // micro_batch x grad_accum x dp the recipe's own keys give (1 x 8 x 8 = 64).
  const Config cfg = gpt({"parallel.dp=8", "train.global_batch=24"});
  const PlanSearch plan = search_layouts(cfg, 8, parse_layout("sp=false,zero=0,recompute=false", 8),
                                         80e9, h100(), nvswitch());
  EXPECT_DOUBLE_EQ(plan.global_batch, 24);
  ASSERT_FALSE(plan.rows.empty());
  for (const PlanRow& row : plan.rows)
    EXPECT_EQ(row.layout.micro_batch * row.layout.grad_accum * row.layout.dp, 24)
        << row.layout.label();
}

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(Plan, Refusals) {
  expect_error([] { parse_layout("tp=2,bogus=3", 8); }, "unknown field \"bogus\"");
  expect_error([] { parse_layout("tp=3", 8); }, "tp=3 does not divide --ranks 8");
  expect_error([] { parse_layout("tp=2,pp=2,dp=1,cp=1", 8); }, "does not equal --ranks 8");
  expect_error([] { parse_layout("zero=x", 8); }, "zero=x");
  expect_error([] { cluster_preset("dgx-z100", 8); }, "--cluster dgx-z100");
  expect_error([] { cluster_preset("dgx-h100:1", 16); }, "fewer than --ranks 16");
  expect_error([] { engine_named("deepspeed"); }, "--engine deepspeed");
  const Config cfg = gpt({"parallel.dp=8"});
  const parallel::Topology topo = parallel::uniform_cluster(1, 8, 450, 3e-6, 450, 3e-6);
  expect_error([&] { search_layouts(cfg, 8, {}, 1e6, h100(), topo); }, "the smallest needs");
  expect_error([&] { search_layouts(cfg, 8, parse_layout("tp=8,mb=3", 8), 80e9, h100(), topo); },
               "mb");
  // A topology measured on other ranks: the topology file's own refusal.
  expect_error([&] { topo.check_ranks(16, "probe.json"); }, "probe.json");
  expect_error([] { Calibration::read("/nonexistent/calibration.json"); }, "--calibrate");
}

// Every --layout field alone and in pairs, on a small dense recipe and a MoE one: each search
// ends with layouts or with one line (an Error), never a signal. Before the fix a fixed pp with
// dp free divided by zero (cp took every rank tp left, and dp became 0).
TEST(Plan, EveryLayoutFieldAloneAndInPairsEndsInLayoutsOrOneLine) {
  // 4 ranks (the search is widest where only one field is fixed: 8 took 30 s) and one value
  // a field, chosen to leave little room: cp=2 after tp=2 leaves one rank of 4, which pp=2
  // cannot split (the case that divided by zero).
  const std::vector<std::pair<std::string, std::vector<std::string>>> fields = {
      {"tp", {"2"}},           {"tp_shape", {"2x2"}},  {"tp_order", {"column"}},
      {"tp_chunks", {"2"}},    {"sp", {"true"}},       {"cp", {"2"}},
      {"cp_impl", {"hybrid"}}, {"cp_ulysses", {"2"}},  {"pp", {"2"}},
      {"schedule", {"kfkb"}},  {"vp", {"2"}},          {"pp_group", {"4"}},
      {"dp", {"2"}},           {"mb", {"3"}},          {"ga", {"4"}},
      {"ep", {"2"}},           {"etp", {"2"}},         {"zero", {"3"}},
      {"offload", {"cpu"}},    {"recompute", {"true"}}};
  std::vector<std::string> specs;
  for (size_t i = 0; i < fields.size(); ++i)
    for (const std::string& a : fields[i].second) {
      specs.push_back(fields[i].first + "=" + a);
      for (size_t j = i + 1; j < fields.size(); ++j)
        for (const std::string& b : fields[j].second)
          specs.push_back(fields[i].first + "=" + a + "," + fields[j].first + "=" + b);
    }
  const Config dense = gpt({"parallel.dp=4"});
  const Config moe =
      gpt({"parallel.dp=4", "model.moe_layers=\"all\"", "model.n_experts=4", "model.top_k=2"});
  const parallel::Topology topo = parallel::uniform_cluster(1, 4, 450, 3e-6, 450, 3e-6);
  int searched = 0, refused = 0;
  for (const Config* cfg : {&dense, &moe})
    for (const std::string& spec : specs) {
      try {
        const PlanSearch plan = search_layouts(*cfg, 4, parse_layout(spec, 4), 80e9, h100(), topo);
        EXPECT_FALSE(plan.rows.empty()) << spec;
        ++searched;
      } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << spec << ": " << e.what();
        ++refused;
      }
    }
  EXPECT_GT(searched, refused);  // most pairs leave layouts: the sweep searched, not only parsed
}

// The README's 70B example, pp fixed with dp free: the layouts with cp = all of tp's 96 ranks
// leave none for pp and are skipped.
TEST(Plan, FixedPipelineWithFreeDataParallelOnTheSeventyBillionRecipe) {
  Config cfg = parse_recipe(
      "[model]\nfamily = \"gpt2\"\nn_layer = 84\nd_model = 8192\nn_head = 64\n"
      "vocab_size = 131072\nmax_seq_len = 4096\ntie_embeddings = false\n[train]\n"
      "device = \"cuda\"\nprecision = \"bf16\"\nseq_len = 4096\nmicro_batch = 1\n"
      "grad_accum = 8\neval_every = 0\n[parallel]\ntp = 8\npp = 2\ndp = 48\n",
      "gpt-70b.toml", {});
  const Machine m = cluster_preset("dgx-h100", 768).machine;
  const parallel::Topology topo = parallel::uniform_cluster(96, 8, 450, 3e-6, 50, 5e-6);
  const PlanSearch plan = search_layouts(
      cfg, 768, parse_layout("tp=8,pp=2,sp=true,zero=1,recompute=false", 768), 80e9, m, topo);
  ASSERT_FALSE(plan.rows.empty());
  for (const PlanRow& row : plan.rows)
    EXPECT_EQ(row.layout.pp * row.layout.tp * row.layout.cp * row.layout.dp, 768);
}

// The 530B and 1T rows of Megatron-LM's A100 table have heads 160 wide (CUDA's attention takes
// up to 256): their recipes load and plan. 530B on its published layout; 1T's (pp 64) is over
// the 63 pipeline stages pentad's message tags allow (parallel/pp/schedule.cpp), so on pp 32
// over twice the data parallelism, the same 3072 GPUs.
TEST(Plan, TheWideHeadedMegatronRowsPlan) {
  struct Row {
    const char* recipe;
    int ranks;
    const char* layout;
  };
  const auto path = [](const char* recipe) {
    return (std::filesystem::path(PENTAD_SOURCE_DIR) / "bench/plan/megatron" / recipe).string();
  };
  const std::string fixed = ",mb=1,sp=true,zero=1,recompute=false,cp=1,schedule=1f1b,vp=1";
  for (const Row& r : {Row{"gpt-530b.toml", 2520, "tp=8,pp=35,dp=9"},
                       Row{"gpt-1t.toml", 3072, "tp=8,pp=32,dp=12"}}) {
    SCOPED_TRACE(r.recipe);
    const Config cfg = load_recipe(path(r.recipe));
    EXPECT_EQ(cfg.model.head_dim(), 160);
    const Machine m = cluster_preset("dgx-a100", r.ranks).machine;
    const parallel::Topology topo = parallel::uniform_cluster(r.ranks / 8, 8, 300, 3e-6, 25, 5e-6);
    const PlanSearch plan =
        search_layouts(cfg, r.ranks, parse_layout(r.layout + fixed, r.ranks), 1e13, m, topo);
    ASSERT_FALSE(plan.rows.empty());
    const Prediction& p = plan.rows.front().prediction;
    EXPECT_GT(p.step_seconds, 0.0);
    EXPECT_GT(p.mfu, 0.1);
    EXPECT_LT(p.mfu, 1.0);
    if (r.ranks == 3072)
      expect_error(
          [&] {
            search_layouts(cfg, r.ranks, parse_layout("tp=8,pp=64,dp=6" + fixed, r.ranks), 1e13, m,
                           topo);
          },
          "at most 63");
  }
}

// A kernel table of a 2-core machine, one and two threads.
Calibration two_cores() {
  Calibration c;
  c.machine = "test";
  c.cores = 2;
  for (int t : {1, 2}) {
    KernelRates r;
    r.threads = t;
    r.gemm = {{1e6, 1e9 * t}, {1e9, 4e9 * t}};
    r.attention_flops_per_s = 2e9 * t;
    r.elementwise_bytes_per_s = 5e9;
    r.adamw_params_per_s = 1e8 * t;
    r.copy_bytes_per_s = 8e9;
    c.rates.push_back(r);
  }
  return c;
}

TEST(Plan, OversubscribedCpuCoresAreShared) {
  // 8 ranks on a 2-core node. A pipeline stage waiting for its input lends its cores to the
  // stage computing, so pp2's bubble nearly vanishes, which on GPUs it does not.
  const Cluster cpu = this_machine(two_cores(), 8);
  const std::vector<std::string> on_cpu = {"train.device=\"cpu\"", "train.precision=\"fp32\""};
  auto with = [&](std::vector<std::string> keys) {
    keys.insert(keys.end(), on_cpu.begin(), on_cpu.end());
    return gpt(keys);
  };
  const Config pp = with({"parallel.pp=2", "parallel.dp=4"});
  const Prediction shared = predict_step(pp, mesh_config(pp, 8), cpu.machine, cpu.topology);
  const Prediction own = predict(gpt({"parallel.pp=2", "parallel.dp=4"}), nvswitch());
  // m 8, p 2: (p-1)/(m+p-1) = 11% of the stages' time idle; the head's stage, the busiest,
  // idles least (its share of the step: about 5%).
  EXPECT_GT(own.bubble / own.step_seconds, 0.03);
  EXPECT_LT(shared.bubble / shared.step_seconds, 0.1 * own.bubble / own.step_seconds);
  EXPECT_GT(shared.oversubscription, 1.0);
  // Shared memory is copied by the cores that compute: 2D tp's chunks hide nothing among the
  // ranks of one CPU node, while on GPUs (NCCL beside the GEMMs) they hide 3/4 of it.
  const Config one = with({"parallel.tp=4", "parallel.tp_shape=\"2x2\"", "parallel.dp=2"});
  const Config four =
      with({"parallel.tp=4", "parallel.tp_shape=\"2x2\"", "parallel.dp=2", "parallel.tp_chunks=4"});
  const double cpu_one = predict_step(one, mesh_config(one, 8), cpu.machine, cpu.topology).tp;
  const double cpu_four = predict_step(four, mesh_config(four, 8), cpu.machine, cpu.topology).tp;
  EXPECT_GT(cpu_one, 0.0);
  EXPECT_DOUBLE_EQ(cpu_one, cpu_four);
  const double gpu_one =
      predict(gpt({"parallel.tp=4", "parallel.tp_shape=\"2x2\"", "parallel.dp=2"}), nvswitch()).tp;
  const double gpu_four = predict(gpt({"parallel.tp=4", "parallel.tp_shape=\"2x2\"",
                                       "parallel.dp=2", "parallel.tp_chunks=4"}),
                                  nvswitch())
                              .tp;
  EXPECT_LT(gpu_four, 0.5 * gpu_one);  // the loss's all-reduces over tp are not chunked
}

// Over two CPU nodes the gradient all-reduce is pentad's ring, which moves a leg only when
// backward polls it (4 times a layer): more is left after backward than of MPI's all-reduce,
// which the network moves behind backward; ZeRO-1's reduce-scatter (half the legs) is always
// pentad's ring. On one node nothing overlaps and the two are predicted alike.
TEST(Plan, CpuRingMovesOnlyWhenPolled) {
  const Cluster cpu = this_machine(two_cores(), 8);
  const parallel::Topology two_nodes = parallel::uniform_cluster(2, 4, 5, 5e-6, 0.2, 2e-4);
  auto dp_part = [&](const parallel::Topology& topo, std::vector<std::string> keys) {
    keys.insert(keys.end(), {"train.device=\"cpu\"", "train.precision=\"fp32\"", "parallel.dp=8"});
    const Config cfg = gpt(keys);
    return predict_step(cfg, mesh_config(cfg, 8), cpu.machine, topo).dp;
  };
  const double ring = dp_part(two_nodes, {});
  const double mpi = dp_part(two_nodes, {"parallel.ring_all_reduce=false"});
  EXPECT_GT(ring, 1.2 * mpi);
  EXPECT_DOUBLE_EQ(dp_part(two_nodes, {"parallel.zero=1"}),
                   dp_part(two_nodes, {"parallel.zero=1", "parallel.ring_all_reduce=false"}));
  EXPECT_DOUBLE_EQ(dp_part(cpu.topology, {}),
                   dp_part(cpu.topology, {"parallel.ring_all_reduce=false"}));
}

TEST(Plan, CalibrationRoundTripAndInterpolation) {
  Calibration c = two_cores();
  c.rates[0].attention_by_keys = {{64, 1e9}, {512, 4e9}};
  const std::string path = std::filesystem::temp_directory_path() / "pentad_plan_test_cal.json";
  c.write(path);
  const Calibration back = Calibration::read(path);
  std::filesystem::remove(path);
  ASSERT_EQ(back.rates.size(), 2u);
  EXPECT_DOUBLE_EQ(back.rates[1].gemm[1].second, 8e9);
  const KernelRates one = back.at_threads(1);
  EXPECT_DOUBLE_EQ(Calibration::gemm_seconds(one, 1e6), 1e-3);
  EXPECT_DOUBLE_EQ(Calibration::gemm_seconds(one, 1e9), 0.25);
  // Between two shapes the rate is interpolated in log(flops): halfway, the mean rate.
  EXPECT_NEAR(Calibration::gemm_seconds(one, std::sqrt(1e6 * 1e9)), std::sqrt(1e15) / 2.5e9, 1e-12);
  // Attention by the keys a call sees: clamped at the ends, interpolated in log(keys).
  ASSERT_EQ(one.attention_by_keys.size(), 2u);
  EXPECT_DOUBLE_EQ(Calibration::attention_seconds(one, 1e9, 32), 1.0);
  EXPECT_DOUBLE_EQ(Calibration::attention_seconds(one, 1e9, 4096), 0.25);
  EXPECT_NEAR(Calibration::attention_seconds(one, 1e9, std::sqrt(64.0 * 512)), 1 / 2.5, 1e-12);
  // A file without the table (older): the single rate throughout.
  EXPECT_DOUBLE_EQ(Calibration::attention_seconds(back.at_threads(2), 4e9, 64), 1.0);
}

// The CPU compute model: attention calls that see fewer keys (ring attention's blocks) run at
// the kernel table's rate for that length, and a GEMM's operands come from memory, so the
// same flops in micro-batches of fewer rows cost more (the weights are read once a GEMM).
TEST(Plan, CpuComputeFollowsKeysAndRows) {
  auto predict_on = [](Calibration cal, std::vector<std::string> keys) {
    keys.insert(keys.end(), {"train.device=\"cpu\"", "train.precision=\"fp32\""});
    const Config cfg = gpt(keys);
    const Cluster cpu = this_machine(cal, 8);
    return predict_step(cfg, mesh_config(cfg, 8), cpu.machine, cpu.topology).compute;
  };
  const std::vector<std::string> ring = {"parallel.cp=4", "parallel.cp_impl=\"ring\"",
                                         "parallel.dp=2"};
  const std::vector<std::string> ulysses = {"parallel.cp=4", "parallel.cp_impl=\"ulysses\"",
                                            "parallel.dp=2"};
  Calibration by_keys = two_cores();
  for (KernelRates& r : by_keys.rates) r.attention_by_keys = {{64, 1e8}, {4096, 2e9}};
  EXPECT_DOUBLE_EQ(predict_on(two_cores(), ring), predict_on(two_cores(), ulysses));
  EXPECT_GT(predict_on(by_keys, ring), 1.05 * predict_on(by_keys, ulysses));

  // The same sequences a step in micro-batches of 1 or 4: the memory traffic (the compute
  // at unlimited bandwidth taken off) is larger with more, smaller micro-batches.
  Calibration fast_memory = two_cores();
  for (KernelRates& r : fast_memory.rates) r.elementwise_bytes_per_s = 1e30;
  auto traffic = [&](const char* mb, const char* ga) {
    const std::vector<std::string> keys = {"parallel.dp=8", mb, ga};
    return predict_on(two_cores(), keys) - predict_on(fast_memory, keys);
  };
  EXPECT_GT(traffic("train.micro_batch=1", "train.grad_accum=4"),
            1.2 * traffic("train.micro_batch=4", "train.grad_accum=1"));
}

}  // namespace plan_test
