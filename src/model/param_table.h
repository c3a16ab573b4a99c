#pragma once
// Every parameter of the model, declared once (llm.c's table of sizes, torchtitan's per-block
// sharding plan): its name, whole shape, initialisation and how tensor and expert
// parallelism cut it. Model::build_params and MoeBlock register their parameters from it,
// the memory plan (plan/memory_budget.cpp) sums it, and the checkpoint converters
// (cli/hf_layout.cpp, cli/convert_llmc.cpp) map its names, refusing a name they do not know.
// A new parameter is one more row here (and its use in the forward).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/params.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/sharding.h"

namespace pentad {

// How the tp ranks (tp = d1 x d2; 1D: d1 = tp, d2 = 1) and the expert ranks cut a parameter.
enum class Cut : uint8_t {
  Whole,         // every rank holds all of it: norms, GPT-2's positions, the router
  Vocab,         // (V, C): rows over every tp rank (vocabulary parallel, 2D too)
  Column,        // (out, in): out over d1, in over d2 (1D: Megatron's column parallel)
  Row,           // (out, in): out over d2, in over d1 (1D: row parallel)
  ColumnBias,    // (out): over d1 with its column's rows, a copy on each d2 rank
  RowBias,       // (out): over d2, a copy on each d1 rank (1D: whole)
  ExpertColumn,  // one routed expert's (Fe, C): experts over ep, rows over etp
  ExpertRow,     // one routed expert's (C, Fe): experts over ep, columns over etp
  ExpertWhole,   // one routed expert's output bias: experts over ep, whole over etp
};

// Which of the model's (or the MoE block's) parameter ids a declaration fills; Other: none
// (a parameter no forward reads yet).
enum class Role : uint8_t {
  Other,
  Wte,
  Wpe,
  Norm1W,
  Norm1B,
  QW,
  QB,
  KW,
  KB,
  VW,
  VB,
  OW,
  OB,
  Norm2W,
  Norm2B,
  GateW,  // the MLP's (dense, shared experts or one routed expert's)
  UpW,
  UpB,
  DownW,
  DownB,
  Router,
  ExpertBias,
  NormFW,
  NormFB,
  Head,
};

// The activation a weight multiplies, for the GEMM it runs in: the weights reading the same
// one run as one GEMM (q, k and v; gate and up), their outputs side by side. None: no GEMM's.
enum class Reads : uint8_t { None, Norm1, Attention, Norm2, Activation };

struct ParamDecl {
  // Within its scope: a layer's "attn.q.weight" (layer_prefix), a routed expert's
  // "up.weight" (expert_prefix); the embedding's and the final ones whole ("wte.weight").
  std::string name;
  Shape shape;  // the whole parameter's
  Cut cut = Cut::Whole;
  Role role = Role::Other;
  Init init = Init::Normal;
  float init_std = 0.0f;
  bool decay = false;  // weight decay applies
  // Replicated over tp, but each tp rank's gradient is partial under sequence parallelism
  // (it sees its rows only): summed over tp after the step's last backward.
  bool tp_partial = false;
  // Registered by the MoE block (model/moe.h): the router, the expert bias and the routed
  // experts' parameters.
  bool routed = false;
  Reads reads = Reads::None;
  bool expert() const { return cut >= Cut::ExpertColumn; }
};

// Feed-forward width: d_ff if set, else 4C (GPT-2) or LLaMA's 2/3 * 4C rounded up to 256.
int64_t ffn_dim(const ModelConfig& cfg);
// A layer's MLP width: the dense MLP's, or an MoE layer's shared experts' (one MLP as wide
// as all of them; 0 without shared experts).
int64_t mlp_width(const ModelConfig& cfg, bool moe);

// In the order the forward uses them (the parameter arena's order): the embedding; one
// layer (an MoE layer: attention, shared experts, router, expert bias, then one routed
// expert's, repeated for each expert); the final norm and an untied head (a tied head is
// the embedding).
std::vector<ParamDecl> embedding_params(const ModelConfig& cfg);
std::vector<ParamDecl> layer_params(const ModelConfig& cfg, bool moe);
std::vector<ParamDecl> final_params(const ModelConfig& cfg);
// The whole table, built once from the config, as its readers take it (a test may add a
// row to see it reach every one of them).
struct ParamTable {
  std::vector<ParamDecl> embedding, dense_layer, moe_layer, final;  // moe_layer: MoE models
  const std::vector<ParamDecl>& layer(bool moe) const { return moe ? moe_layer : dense_layer; }
};
ParamTable param_table(const ModelConfig& cfg);
// The same, shared: each thread keeps the last model's table (the planner estimates many
// layouts of one model). model.recompute does not change the table.
std::shared_ptr<const ParamTable> shared_param_table(const ModelConfig& cfg);
std::string layer_prefix(int64_t layer);                   // "layers.3."
std::string expert_prefix(int64_t layer, int64_t expert);  // "layers.3.moe.experts.5."

// Registers this rank's slice of `d` as parameter `name`: its tp block, and for a routed
// expert's its etp slice (marked as an expert's). Returns the id.
int add_param(ParamStore& params, const ParamDecl& d, const std::string& name,
              const TensorParallelHooks& tp, int64_t etp_degree = 1, int64_t etp_rank = 0);

// The parallel degrees that cut parameters, as doubles (a recipe may ask for 10^12-wide
// layers and the products must not wrap).
struct CutDegrees {
  double tp = 1, tp_d2 = 1, ep = 1, etp = 1;
};
// Values of `d` on one rank: for a routed expert's, of one expert (a rank holds
// n_experts / ep of them).
double rank_values(const ParamDecl& d, const CutDegrees& deg);
// Summed over decls: the values one rank holds, and of those the routed experts'
// (n_experts / ep experts).
struct RankValues {
  double all = 0, experts = 0;
};
RankValues rank_values(const std::vector<ParamDecl>& decls, const CutDegrees& deg,
                       int64_t n_experts);

// One GEMM of a layer on one rank, per row of its input: (rows, k) x (k, n).
struct LayerGemm {
  Reads reads = Reads::None;
  double k = 0, n = 0;
};
// The GEMMs of a layer's tensor-parallel weights (column and row), in forward order; with
// `experts`, those of one routed expert instead (cut over etp).
std::vector<LayerGemm> layer_gemms(const std::vector<ParamDecl>& decls, const CutDegrees& deg,
                                   bool experts);

}  // namespace pentad
