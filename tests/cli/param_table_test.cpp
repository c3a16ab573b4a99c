// The model's parameter table (src/model/param_table.h) is the one description its readers
// share: the model registers what it declares, the memory plan is its sum, the Hugging Face
// table names every row of it (or refuses), and a row added to it reaches all of them.
#include "model/param_table.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "cli/hf_layout.h"
#include "core/check.h"
#include "model/model.h"
#include "model/moe.h"
#include "plan/memory_budget.h"
#include "recipe/recipe.h"

using namespace pentad;

enum class Kind { GPT2, LLaMA, Mixtral, GPT2Moe };

namespace {

Config table_recipe(Kind kind) {
  Config c = parse_recipe("", "test");
  ModelConfig& m = c.model;
  m.family = kind == Kind::GPT2 || kind == Kind::GPT2Moe ? ModelFamily::GPT2 : ModelFamily::LLaMA;
  m.n_layer = 3;
  m.d_model = 16;
  m.n_head = 4;
  m.n_kv_head = m.family == ModelFamily::LLaMA ? 2 : 0;
  m.vocab_size = 40;
  m.max_seq_len = 8;
  m.tie_embeddings = m.family == ModelFamily::GPT2;
  if (kind == Kind::Mixtral || kind == Kind::GPT2Moe) {
    m.moe_layers = kind == Kind::Mixtral ? "all" : "1";
    m.n_experts = 4;
    m.top_k = 2;
    m.d_ff_expert = 24;
    m.n_shared_experts = kind == Kind::GPT2Moe ? 1 : 0;
  }
  c.train.micro_batch = 2;
  c.train.seq_len = 8;
  return c;
}

// The table expanded over the whole model: every parameter's name and whole shape.
std::map<std::string, std::vector<int64_t>> table_names(const ModelConfig& m, const ParamTable& t) {
  std::map<std::string, std::vector<int64_t>> names;
  auto add = [&](const std::string& name, const Shape& s) {
    names[name] = std::vector<int64_t>(s.dims.begin(), s.dims.begin() + s.ndim);
  };
  for (const ParamDecl& d : t.embedding) add(d.name, d.shape);
  for (int64_t l = 0; l < m.n_layer; ++l) {
    const bool moe = is_moe_layer(m, l);
    for (const ParamDecl& d : t.layer(moe)) {
      if (!d.expert()) add(layer_prefix(l) + d.name, d.shape);
      for (int64_t e = 0; d.expert() && e < m.n_experts; ++e)
        add(expert_prefix(l, e) + d.name, d.shape);
    }
  }
  for (const ParamDecl& d : t.final) add(d.name, d.shape);
  return names;
}

std::map<std::string, std::vector<int64_t>> model_names(const Model& model, double* values) {
  std::map<std::string, std::vector<int64_t>> names;
  *values = 0;
  for (const ParamSpec& s : model.params().specs()) {
    names[s.name] = std::vector<int64_t>(s.global_shape.dims.begin(),
                                         s.global_shape.dims.begin() + s.global_shape.ndim);
    *values += double(s.local_shape.numel());
  }
  return names;
}

}  // namespace

class ParamTableKinds : public ::testing::TestWithParam<Kind> {};
class ParamTableHfKinds : public ::testing::TestWithParam<Kind> {};

// What the model registers is the table, name for name and shape for shape, and the memory
// plan's parameter count is the table's sum.
TEST_P(ParamTableKinds, IsWhatTheModelBuildsAndTheMemoryPlanCounts) {
  const Config cfg = table_recipe(GetParam());
  const Model model(cfg.model, cfg.train.micro_batch, cfg.train.seq_len);
  double values = 0;
  EXPECT_EQ(model_names(model, &values), table_names(cfg.model, param_table(cfg.model)));
  EXPECT_EQ(estimate_memory(cfg, parallel::MeshConfig{}).values, values);
}

// The Hugging Face table names every parameter of the table once, except those
// transformers has no place for.
TEST_P(ParamTableHfKinds, IsWhatTheHfTableNames) {
  const ModelConfig m = table_recipe(GetParam()).model;
  std::map<std::string, std::vector<int64_t>> named;
  for (const ckpt::HfEntry& e : ckpt::hf_table(m))
    for (const auto& [name, dims] : e.parts) named[name] = dims;
  for (const auto& [name, dims] : ckpt::pentad_only_params(m)) named[name] = dims;
  EXPECT_EQ(named, table_names(m, param_table(m)));
}

INSTANTIATE_TEST_SUITE_P(Kinds, ParamTableKinds,
                         ::testing::Values(Kind::GPT2, Kind::LLaMA, Kind::Mixtral, Kind::GPT2Moe));
// (transformers has no GPT-2 with experts)
INSTANTIATE_TEST_SUITE_P(Kinds, ParamTableHfKinds,
                         ::testing::Values(Kind::GPT2, Kind::LLaMA, Kind::Mixtral));

// A toy parameter kind, one row added to the table, reaches the model's parameters (each
// layer has it, and the model still trains), the memory plan (C more values a layer) and
// the Hugging Face converter (which refuses to export a model it would have to leave it
// out of, naming it).
TEST(ParamTable, ANewRowReachesEveryReader) {
  for (Kind kind : {Kind::GPT2, Kind::LLaMA}) {
    const Config cfg = table_recipe(kind);
    const ModelConfig& m = cfg.model;
    ParamTable table = param_table(m);
    table.dense_layer.push_back({"attn.toy.weight", Shape{m.d_model}, Cut::Whole, Role::Other,
                                 Init::Ones, 0.0f, false, true});

    Model model(m, table, cfg.train.micro_batch, cfg.train.seq_len);
    double values = 0;
    const auto names = model_names(model, &values);
    for (int64_t l = 0; l < m.n_layer; ++l)
      EXPECT_EQ(names.at(layer_prefix(l) + "attn.toy.weight"), std::vector<int64_t>{m.d_model});
    model.params().initialize(1);
    std::vector<int32_t> tokens(size_t(cfg.train.micro_batch * cfg.train.seq_len), 3);
    model.params().zero_grads();
    EXPECT_GT(model.forward(tokens.data(), tokens.data(), 1.0f), 0.0f);
    model.backward();

    const parallel::MeshConfig one;
    EXPECT_EQ(estimate_memory(cfg, one, table).values, values);
    EXPECT_EQ(estimate_memory(cfg, one, table).values - estimate_memory(cfg, one).values,
              double(m.n_layer * m.d_model));

    try {
      ckpt::hf_table(m, table);
      ADD_FAILURE() << "an export without layers.0.attn.toy.weight";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("layers.0.attn.toy.weight"), std::string::npos)
          << e.what();
    }
  }
}

// The cost model's GEMMs are the table's weights: one reading norm1's output runs in the
// q, k, v GEMM (its outputs beside theirs), and a 2D cut divides its sides as the model does.
TEST(ParamTable, ANewWeightJoinsItsGemm) {
  const ModelConfig m = table_recipe(Kind::LLaMA).model;
  const double C = double(m.d_model), Ckv = double(m.kv_heads() * m.head_dim());
  const CutDegrees tp4{4, 2, 1, 1};  // tp 4 as 2 x 2
  ParamTable table = param_table(m);
  const std::vector<LayerGemm> before = layer_gemms(table.dense_layer, tp4, false);
  ASSERT_EQ(before.size(), 4u);  // q k v, o, gate up, down
  EXPECT_EQ(before[0].k, C / 2);
  EXPECT_EQ(before[0].n, (C + 2 * Ckv) / 2);
  table.dense_layer.push_back({"attn.toy.weight", Shape{m.d_model, m.d_model}, Cut::Column,
                               Role::Other, Init::Normal, 0.02f, true, false, false, Reads::Norm1});
  const std::vector<LayerGemm> after = layer_gemms(table.dense_layer, tp4, false);
  ASSERT_EQ(after.size(), 4u);
  EXPECT_EQ(after[0].n, (2 * C + 2 * Ckv) / 2);
  for (size_t i = 1; i < after.size(); ++i) EXPECT_EQ(after[i].n, before[i].n);
}
