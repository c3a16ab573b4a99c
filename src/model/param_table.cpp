// The model's parameters declared once (model/param_table.h).
#include "model/param_table.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "core/check.h"
#include "model/moe.h"

namespace pentad {

int64_t ffn_dim(const ModelConfig& cfg) {
  if (cfg.d_ff > 0) return cfg.d_ff;
  if (cfg.family == ModelFamily::GPT2) return 4 * cfg.d_model;
  int64_t hidden = 2 * (4 * cfg.d_model) / 3;
  return (hidden + 255) / 256 * 256;
}

int64_t mlp_width(const ModelConfig& cfg, bool moe) {
  return moe ? cfg.n_shared_experts * expert_ffn_dim(cfg) : ffn_dim(cfg);
}

std::string layer_prefix(int64_t layer) {
  return "layers." + std::to_string(layer) + ".";
}

std::string expert_prefix(int64_t layer, int64_t expert) {
  return layer_prefix(layer) + "moe.experts." + std::to_string(expert) + ".";
}

namespace {

// Matrices: normal, decayed; vectors: ones or zeros, not decayed.
ParamDecl matrix(std::string name, Shape shape, Cut cut, Role role, float std,
                 Reads reads = Reads::None) {
  return {std::move(name), shape, cut, role, Init::Normal, std, true, false, false, reads};
}
ParamDecl vector(std::string name, int64_t n, Cut cut, Role role, Init init,
                 bool tp_partial = false) {
  return {std::move(name), Shape{n}, cut, role, init, 0.0f, false, tp_partial};
}

// Residual projections are scaled so that the residual stream's variance does not grow
// with depth.
float residual_std(const ModelConfig& cfg) {
  return cfg.init_std / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
}

// An MLP of width W (up, and gate for LLaMA's SwiGLU; down; GPT-2's biases) under `pre`.
void add_mlp(std::vector<ParamDecl>& t, const ModelConfig& cfg, const std::string& pre, int64_t W,
             bool expert) {
  const int64_t C = cfg.d_model;
  const bool gpt2 = cfg.family == ModelFamily::GPT2;
  const Cut column = expert ? Cut::ExpertColumn : Cut::Column;
  const Cut row = expert ? Cut::ExpertRow : Cut::Row;
  // A routed expert's matrices start at zero where init_std is 0 (MoeBlock's rule).
  auto weight = [&](std::string name, Shape shape, Cut cut, Role role, float std, Reads reads) {
    ParamDecl d = matrix(std::move(name), shape, cut, role, std, reads);
    if (expert && std <= 0) d.init = Init::Zeros;
    return d;
  };
  const float std = cfg.init_std;
  if (!gpt2)
    t.push_back(weight(pre + "gate.weight", Shape{W, C}, column, Role::GateW, std, Reads::Norm2));
  t.push_back(weight(pre + "up.weight", Shape{W, C}, column, Role::UpW, std, Reads::Norm2));
  if (gpt2)
    t.push_back(vector(pre + "up.bias", W, expert ? Cut::ExpertColumn : Cut::ColumnBias, Role::UpB,
                       Init::Zeros));
  t.push_back(weight(pre + "down.weight", Shape{C, W}, row, Role::DownW, residual_std(cfg),
                     Reads::Activation));
  if (gpt2)
    t.push_back(vector(pre + "down.bias", C, expert ? Cut::ExpertWhole : Cut::RowBias, Role::DownB,
                       Init::Zeros));
}

}  // namespace

std::vector<ParamDecl> embedding_params(const ModelConfig& cfg) {
  const int64_t C = cfg.d_model;
  std::vector<ParamDecl> t = {
      matrix("wte.weight", Shape{cfg.vocab_size, C}, Cut::Vocab, Role::Wte, cfg.init_std)};
  if (cfg.family == ModelFamily::GPT2)
    t.push_back(
        matrix("wpe.weight", Shape{cfg.max_seq_len, C}, Cut::Whole, Role::Wpe, cfg.init_std));
  return t;
}

std::vector<ParamDecl> layer_params(const ModelConfig& cfg, bool moe) {
  const int64_t C = cfg.d_model, Ckv = cfg.kv_heads() * cfg.head_dim();
  const bool gpt2 = cfg.family == ModelFamily::GPT2;
  const float std = cfg.init_std;
  std::vector<ParamDecl> t;
  auto norm = [&](const std::string& name, Role w, Role b) {
    t.push_back(vector(name + ".weight", C, Cut::Whole, w, Init::Ones, true));
    if (gpt2) t.push_back(vector(name + ".bias", C, Cut::Whole, b, Init::Zeros, true));
  };
  // Attention: q, k, v column parallel (heads over d1), o row parallel.
  auto projection = [&](const std::string& name, int64_t out, Role w, Role b) {
    t.push_back(
        matrix("attn." + name + ".weight", Shape{out, C}, Cut::Column, w, std, Reads::Norm1));
    if (gpt2) t.push_back(vector("attn." + name + ".bias", out, Cut::ColumnBias, b, Init::Zeros));
  };
  norm("norm1", Role::Norm1W, Role::Norm1B);
  projection("q", C, Role::QW, Role::QB);
  projection("k", Ckv, Role::KW, Role::KB);
  projection("v", Ckv, Role::VW, Role::VB);
  t.push_back(matrix("attn.o.weight", Shape{C, C}, Cut::Row, Role::OW, residual_std(cfg),
                     Reads::Attention));
  if (gpt2) t.push_back(vector("attn.o.bias", C, Cut::RowBias, Role::OB, Init::Zeros));
  norm("norm2", Role::Norm2W, Role::Norm2B);
  // The MLP: dense, or an MoE layer's shared experts.
  if (const int64_t W = mlp_width(cfg, moe); W > 0)
    add_mlp(t, cfg, moe ? "moe.shared." : "mlp.", W, false);
  if (!moe) return t;
  const int64_t E = cfg.n_experts;
  // Each tp rank routes its own rows (SP): the router's gradient is partial.
  const size_t routed = t.size();
  t.push_back(
      {"moe.router.weight", Shape{E, C}, Cut::Whole, Role::Router, Init::Normal, std, true, true});
  // Selection bias: never trained (zero gradient, no decay), moved by MoeBlock::update_bias.
  t.push_back(vector("moe.expert_bias", E, Cut::Whole, Role::ExpertBias, Init::Zeros));
  add_mlp(t, cfg, "", expert_ffn_dim(cfg), true);  // one routed expert's
  for (size_t k = routed; k < t.size(); ++k) t[k].routed = true;
  return t;
}

std::vector<ParamDecl> final_params(const ModelConfig& cfg) {
  std::vector<ParamDecl> t = {
      vector("norm_f.weight", cfg.d_model, Cut::Whole, Role::NormFW, Init::Ones, true)};
  if (cfg.family == ModelFamily::GPT2)
    t.push_back(vector("norm_f.bias", cfg.d_model, Cut::Whole, Role::NormFB, Init::Zeros, true));
  if (!cfg.tie_embeddings)
    t.push_back(matrix("lm_head.weight", Shape{cfg.vocab_size, cfg.d_model}, Cut::Vocab, Role::Head,
                       cfg.init_std));
  return t;
}

ParamTable param_table(const ModelConfig& cfg) {
  ParamTable t;
  t.embedding = embedding_params(cfg);
  t.dense_layer = layer_params(cfg, false);
  if (cfg.is_moe()) t.moe_layer = layer_params(cfg, true);
  t.final = final_params(cfg);
  return t;
}

std::shared_ptr<const ParamTable> shared_param_table(const ModelConfig& cfg) {
  thread_local ModelConfig last;
  thread_local std::shared_ptr<const ParamTable> table;
  ModelConfig key = cfg;
  key.recompute = last.recompute;
  if (!table || !(key == last)) {
    table = std::make_shared<const ParamTable>(param_table(cfg));
    last = cfg;
  }
  return table;
}

int add_param(ParamStore& params, const ParamDecl& d, const std::string& name,
              const TensorParallelHooks& tp, int64_t etp_degree, int64_t etp_rank) {
  const Shape& s = d.shape;
  auto whole = [&] { return params.add(name, s, d.init, d.init_std, d.decay); };
  // Split along `dim` into `parts`, part `part` here.
  auto shard = [&](int dim, int64_t parts, int64_t part) {
    const int64_t len = s[dim] / parts;
    return params.add_shard(name, s, d.init, d.init_std, d.decay, dim, part * len, len);
  };
  const int64_t p = tp.degree(), r = tp.rank();
  const int64_t d1 = tp.heads_degree(), i = tp.heads_rank();
  const int64_t d2 = tp.hidden_degree(), j = tp.hidden_rank();
  // 2D tp: rank (i, j) holds block (i, j) of a matrix; a bias goes with its block's rows
  // (column) or output columns (row), a copy on each rank of the other direction.
  auto block = [&](int64_t row_parts, int64_t row_part, int64_t col_parts, int64_t col_part) {
    const int64_t rows = s[0] / row_parts, cols = s[1] / col_parts;
    return params.add_block(name, s, d.init, d.init_std, d.decay, row_part * rows, rows,
                            col_part * cols, cols);
  };
  auto replicated = [&](int id, int64_t replica) {
    params.set_tp_replica(id, int(replica));
    return id;
  };
  switch (d.cut) {
    case Cut::Whole:
      return whole();
    case Cut::Vocab:
      return p == 1 ? whole() : shard(0, p, r);
    case Cut::Column:
      if (d2 > 1) return block(d1, i, d2, j);
      return p == 1 ? whole() : shard(0, p, r);
    case Cut::Row:
      if (d2 > 1) return block(d2, j, d1, i);
      return p == 1 ? whole() : shard(1, p, r);
    case Cut::ColumnBias:
      if (d2 > 1) return replicated(shard(0, d1, i), j);
      return p == 1 ? whole() : shard(0, p, r);
    case Cut::RowBias:
      if (d2 > 1) return replicated(shard(0, d2, j), i);
      return whole();
    case Cut::ExpertColumn:
    case Cut::ExpertRow:
    case Cut::ExpertWhole: {
      const int dim = d.cut == Cut::ExpertColumn ? 0 : d.cut == Cut::ExpertRow ? 1 : -1;
      const int id = etp_degree == 1 || dim < 0 ? whole() : shard(dim, etp_degree, etp_rank);
      params.mark_expert(id);
      return id;
    }
  }
  PENTAD_CHECK(false, "parameter {}: unknown cut", name);
  return -1;
}

double rank_values(const ParamDecl& d, const CutDegrees& deg) {
  double n = 1;
  for (int k = 0; k < d.shape.ndim; ++k) n *= double(d.shape[k]);
  const double d1 = deg.tp / deg.tp_d2;
  switch (d.cut) {
    case Cut::Whole:
    case Cut::ExpertWhole:
      return n;
    case Cut::Vocab:
    case Cut::Column:
    case Cut::Row:
      return n / deg.tp;
    case Cut::ColumnBias:
      return n / d1;
    case Cut::RowBias:
      return n / deg.tp_d2;
    case Cut::ExpertColumn:
    case Cut::ExpertRow:
      return n / deg.etp;
  }
  return n;
}

RankValues rank_values(const std::vector<ParamDecl>& decls, const CutDegrees& deg,
                       int64_t n_experts) {
  RankValues v;
  double one_expert = 0;
  for (const ParamDecl& d : decls) (d.expert() ? one_expert : v.all) += rank_values(d, deg);
  v.experts = double(n_experts) / deg.ep * one_expert;
  v.all += v.experts;
  return v;
}

std::vector<LayerGemm> layer_gemms(const std::vector<ParamDecl>& decls, const CutDegrees& deg,
                                   bool experts) {
  // Summed over a GEMM's weights: their inputs' width and outputs' widths, and what divides
  // each (column: in over d2, out over d1; row: in over d1, out over d2; an expert's: over
  // etp, the width side).
  struct Sum {
    Reads reads;
    double k, n, k_parts, n_parts;
  };
  std::vector<Sum> sums;
  const double d1 = deg.tp / deg.tp_d2, d2 = deg.tp_d2;
  for (const ParamDecl& d : decls) {
    if (d.reads == Reads::None || d.shape.ndim != 2 || d.expert() != experts) continue;
    double k_parts = 0, n_parts = 0;
    switch (d.cut) {
      case Cut::Column:
        k_parts = d2, n_parts = d1;
        break;
      case Cut::Row:
        k_parts = d1, n_parts = d2;
        break;
      case Cut::ExpertColumn:
        k_parts = 1, n_parts = deg.etp;
        break;
      case Cut::ExpertRow:
        k_parts = deg.etp, n_parts = 1;
        break;
      default:
        continue;  // a whole matrix (the router) is the MoE block's own GEMM
    }
    auto same = [&](const Sum& x) { return x.reads == d.reads; };
    auto it = std::find_if(sums.begin(), sums.end(), same);
    if (it == sums.end())
      it = sums.insert(sums.end(), {d.reads, double(d.shape[1]), 0, k_parts, n_parts});
    it->n += double(d.shape[0]);
  }
  std::vector<LayerGemm> gemms;
  for (const Sum& x : sums) gemms.push_back({x.reads, x.k / x.k_parts, x.n / x.n_parts});
  return gemms;
}

}  // namespace pentad
