#include "cli/hf_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <span>

#include "core/check.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/param_table.h"

namespace pentad::ckpt {

Dims HfEntry::hf_shape() const {
  Dims stacked = parts[0].second;
  for (size_t i = 1; i < parts.size(); ++i) stacked[0] += parts[i].second[0];
  return transposed ? Dims{stacked[1], stacked[0]} : stacked;
}

std::string hf_model_type(const ModelConfig& m) {
  if (m.family == ModelFamily::GPT2) return "gpt2";
  return m.is_moe() ? "mixtral" : "llama";
}

void check_hf_exportable(const ModelConfig& m, const std::string& where) {
  if (m.family == ModelFamily::GPT2) {
    if (m.kv_heads() != m.n_head)
      fail("{}: a GPT-2 with n_kv_head {} != n_head {} has no transformers equivalent", where,
           m.kv_heads(), m.n_head);
    if (m.is_moe())
      fail(
          "{}: model.moe_layers = \"{}\": transformers has no GPT-2 with experts (an MoE of the "
          "llama family exports as Mixtral)",
          where, m.moe_layers);
    return;
  }
  if (!m.is_moe()) return;
  // MixtralForCausalLM: every layer routes each token to its top k experts by softmax
  // score, weighted by those scores renormalised to sum to 1; nothing else.
  const size_t moe_layers = moe_layer_indices(m).size();
  if (moe_layers != static_cast<size_t>(m.n_layer))
    fail(
        "{}: model.moe_layers = \"{}\" makes {} of {} layers MoE; Mixtral has experts in every "
        "layer (model.moe_layers = \"all\")",
        where, m.moe_layers, moe_layers, m.n_layer);
  if (m.n_shared_experts > 0)
    fail("{}: model.n_shared_experts = {}: Mixtral has no shared experts", where,
         m.n_shared_experts);
  if (m.moe.score != MoeScore::Softmax)
    fail("{}: moe.score = \"{}\": Mixtral's router scores with softmax", where,
         moe_score_name(m.moe.score));
  if (!m.moe.renormalize)
    fail("{}: moe.renormalize = false: Mixtral divides the top-k weights by their sum", where);
}

namespace {

// Where transformers keeps one of the model table's parameters (model/param_table.h): its
// name (empty: nowhere, a pentad-only parameter) and whether it is stored transposed
// (GPT-2's Conv1D, [in, out]). Parameters of one name stack along their first dim in the
// order of these rows; entries are written in the order of their first row.
struct HfName {
  const char* ours;
  const char* hf;
  bool transposed = false;
};

// GPT2LMHeadModel keeps the body under "transformer." and the head beside it; a file
// without the prefix loads only into the bare GPT2Model, so an untied head (or any head)
// would make from_pretrained refuse it.
constexpr HfName kGpt2Outer[] = {
    {"wte.weight", "transformer.wte.weight"},     {"wpe.weight", "transformer.wpe.weight"},
    {"norm_f.weight", "transformer.ln_f.weight"}, {"norm_f.bias", "transformer.ln_f.bias"},
    {"lm_head.weight", "lm_head.weight"},
};
// Under "transformer.h.<l>.". c_attn.weight [C, 3C] = [Wq^T Wk^T Wv^T]; c_attn.bias = [bq bk bv].
constexpr HfName kGpt2Layer[] = {
    {"norm1.weight", "ln_1.weight"},
    {"norm1.bias", "ln_1.bias"},
    {"attn.q.weight", "attn.c_attn.weight", true},
    {"attn.k.weight", "attn.c_attn.weight", true},
    {"attn.v.weight", "attn.c_attn.weight", true},
    {"attn.q.bias", "attn.c_attn.bias"},
    {"attn.k.bias", "attn.c_attn.bias"},
    {"attn.v.bias", "attn.c_attn.bias"},
    {"attn.o.weight", "attn.c_proj.weight", true},
    {"attn.o.bias", "attn.c_proj.bias"},
    {"norm2.weight", "ln_2.weight"},
    {"norm2.bias", "ln_2.bias"},
    {"mlp.up.weight", "mlp.c_fc.weight", true},
    {"mlp.up.bias", "mlp.c_fc.bias"},
    {"mlp.down.weight", "mlp.c_proj.weight", true},
    {"mlp.down.bias", "mlp.c_proj.bias"},
    {"moe.expert_bias", ""},
};
// pentad's RoPE pairs dimension i with i + d/2 (HF's rotate_half), the convention HF
// LLaMA checkpoints are stored in, so q_proj and k_proj are copied without permutation.
// Mixtral is the same model with block_sparse_moe in place of mlp.
constexpr HfName kLlamaOuter[] = {
    {"wte.weight", "model.embed_tokens.weight"},
    {"norm_f.weight", "model.norm.weight"},
    {"lm_head.weight", "lm_head.weight"},
};
constexpr HfName kLlamaLayer[] = {
    // under "model.layers.<l>."
    {"norm1.weight", "input_layernorm.weight"},
    {"attn.q.weight", "self_attn.q_proj.weight"},
    {"attn.k.weight", "self_attn.k_proj.weight"},
    {"attn.v.weight", "self_attn.v_proj.weight"},
    {"attn.o.weight", "self_attn.o_proj.weight"},
    {"norm2.weight", "post_attention_layernorm.weight"},
    {"mlp.gate.weight", "mlp.gate_proj.weight"},
    {"mlp.up.weight", "mlp.up_proj.weight"},
    {"mlp.down.weight", "mlp.down_proj.weight"},
    {"moe.router.weight", "block_sparse_moe.gate.weight"},
    {"moe.expert_bias", ""},  // aux-loss-free balancing's; Mixtral has none
};
// Under "model.layers.<l>.block_sparse_moe.experts.<e>.": Mixtral's expert is
// w2(silu(w1 x) * w3 x), so w1 is pentad's gate, w3 its up.
constexpr HfName kMixtralExpert[] = {
    {"gate.weight", "w1.weight"},
    {"down.weight", "w2.weight"},
    {"up.weight", "w3.weight"},
};

// The entries of `decls` (one scope of the table: the routed experts' with `experts`),
// names prefixed, appended to `out`. A parameter without a row is refused: an export that
// left it out would load as another model.
void add_entries(std::vector<HfEntry>& out, const std::vector<ParamDecl>& decls,
                 std::span<const HfName> rows, bool experts, const std::string& ours,
                 const std::string& hf, const ModelConfig& m) {
  auto row_of = [&](const ParamDecl& d) {
    return std::find_if(rows.begin(), rows.end(),
                        [&](const HfName& r) { return d.name == r.ours; });
  };
  for (const ParamDecl& d : decls)
    if (d.expert() == experts && row_of(d) == rows.end())
      fail("parameter {}{} of this {} model has no transformers name (cli/hf_layout.cpp)", ours,
           d.name, hf_model_type(m));
  const size_t first = out.size();
  for (const HfName& r : rows) {
    auto d = std::find_if(decls.begin(), decls.end(), [&](const ParamDecl& x) {
      return x.name == r.ours && x.expert() == experts;
    });
    if (d == decls.end() || *r.hf == 0) continue;
    auto e = std::find_if(out.begin() + long(first), out.end(),
                          [&](const HfEntry& x) { return x.hf == hf + r.hf; });
    if (e == out.end()) e = out.insert(out.end(), HfEntry{hf + r.hf, r.transposed, {}});
    e->parts.push_back({ours + d->name, dims_of(d->shape)});
  }
}

std::span<const HfName> layer_rows(const ModelConfig& m) {
  if (m.family == ModelFamily::GPT2) return kGpt2Layer;
  return kLlamaLayer;
}

std::span<const HfName> outer_rows(const ModelConfig& m) {
  if (m.family == ModelFamily::GPT2) return kGpt2Outer;
  return kLlamaOuter;
}

}  // namespace

std::vector<HfEntry> hf_table(const ModelConfig& m) {
  return hf_table(m, param_table(m));
}

std::vector<HfEntry> hf_table(const ModelConfig& m, const ParamTable& table) {
  const bool gpt2 = m.family == ModelFamily::GPT2;
  std::vector<HfEntry> t;
  add_entries(t, table.embedding, outer_rows(m), false, "", "", m);
  for (int64_t l = 0; l < m.n_layer; ++l) {
    const bool moe = m.is_moe() && is_moe_layer(m, l);
    const std::vector<ParamDecl>& decls = table.layer(moe);
    const std::string h =
        gpt2 ? fmt::format("transformer.h.{}.", l) : fmt::format("model.layers.{}.", l);
    add_entries(t, decls, layer_rows(m), false, layer_prefix(l), h, m);
    if (moe)
      for (int64_t e = 0; e < m.n_experts; ++e)
        add_entries(t, decls, kMixtralExpert, true, expert_prefix(l, e),
                    fmt::format("{}block_sparse_moe.experts.{}.", h, e), m);
  }
  // A tied head is the embedding: transformers' save_pretrained leaves it out, and
  // tie_word_embeddings in config.json makes from_pretrained tie it again.
  add_entries(t, table.final, outer_rows(m), false, "", "", m);
  return t;
}

std::vector<std::pair<std::string, Dims>> pentad_only_params(const ModelConfig& m) {
  std::vector<std::pair<std::string, Dims>> only;
  for (int64_t l = 0; l < m.n_layer; ++l)
    for (const ParamDecl& d : layer_params(m, m.is_moe() && is_moe_layer(m, l)))
      for (const HfName& r : layer_rows(m))
        if (d.name == r.ours && *r.hf == 0)
          only.push_back({layer_prefix(l) + d.name, dims_of(d.shape)});
  return only;
}

namespace {

// A float as its shortest decimal (1e-05, not 9.999999747378752e-06), for config.json.
double decimal(float f) {
  return std::stod(fmt::format("{}", f));
}

}  // namespace

nlohmann::ordered_json hf_config(const ModelConfig& m) {
  const int64_t F = ffn_dim(m);
  const std::string type = hf_model_type(m);
  nlohmann::ordered_json c;
  if (type == "gpt2") {
    c["architectures"] = {"GPT2LMHeadModel"};
    c["model_type"] = "gpt2";
    c["vocab_size"] = m.vocab_size;
    c["n_positions"] = m.max_seq_len;
    c["n_ctx"] = m.max_seq_len;
    c["n_embd"] = m.d_model;
    c["n_layer"] = m.n_layer;
    c["n_head"] = m.n_head;
    c["n_inner"] = F == 4 * m.d_model ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(F);
    c["activation_function"] = "gelu_new";  // the tanh approximation pentad's GELU uses
    c["layer_norm_epsilon"] = decimal(m.norm_eps);
    // pentad trains without dropout; so does a model fine-tuned from this export.
    c["resid_pdrop"] = 0.0;
    c["embd_pdrop"] = 0.0;
    c["attn_pdrop"] = 0.0;
  } else {
    const bool mixtral = type == "mixtral";
    c["architectures"] = {mixtral ? "MixtralForCausalLM" : "LlamaForCausalLM"};
    c["model_type"] = type;
    c["vocab_size"] = m.vocab_size;
    c["hidden_size"] = m.d_model;
    c["intermediate_size"] = mixtral ? expert_ffn_dim(m) : F;  // Mixtral: each expert's width
    c["num_hidden_layers"] = m.n_layer;
    c["num_attention_heads"] = m.n_head;
    c["num_key_value_heads"] = m.kv_heads();
    c["head_dim"] = m.head_dim();
    c["max_position_embeddings"] = m.max_seq_len;
    c["rms_norm_eps"] = decimal(m.norm_eps);
    c["rope_theta"] = decimal(m.rope_theta);
    c["hidden_act"] = "silu";
    c["attention_dropout"] = 0.0;
    if (mixtral) {
      c["sliding_window"] = nullptr;  // pentad attends to the whole sequence
      c["num_local_experts"] = m.n_experts;
      c["num_experts_per_tok"] = m.top_k;
      // transformers pools every layer's tokens into one term with no 1/k: the same
      // gradients need its coefficient L/k times pentad's per-layer one.
      c["router_aux_loss_coef"] = decimal(m.moe.aux_loss_coef * float(m.n_layer) / float(m.top_k));
      c["router_jitter_noise"] = 0.0;
      c["output_router_logits"] = false;
    } else {
      c["rope_scaling"] = nullptr;
      c["attention_bias"] = false;
      c["mlp_bias"] = false;
    }
  }
  c["initializer_range"] = decimal(m.init_std);
  c["tie_word_embeddings"] = m.tie_embeddings;
  c["torch_dtype"] = "float32";
  return c;
}

namespace {

// config.json's keys, read with messages naming the file: absent (or null) keys take the
// default given, present ones must have the right type.
struct HfKeys {
  const nlohmann::json& c;
  const std::string& path;

  bool has(const char* key) const { return c.contains(key) && !c[key].is_null(); }
  int64_t integer(const char* key) const {
    if (!has(key)) fail("{}: missing \"{}\"", path, key);
    if (!c[key].is_number_integer()) fail("{}: \"{}\" is not an integer", path, key);
    return c[key].get<int64_t>();
  }
  float number(const char* key, double otherwise) const {
    if (!has(key)) return static_cast<float>(otherwise);
    if (!c[key].is_number()) fail("{}: \"{}\" is not a number", path, key);
    return c[key].get<float>();
  }
  bool flag(const char* key, bool otherwise) const {
    if (!has(key)) return otherwise;
    if (!c[key].is_boolean()) fail("{}: \"{}\" is not true or false", path, key);
    return c[key].get<bool>();
  }
  std::string word(const char* key, const char* otherwise) const {
    if (!has(key)) return otherwise;
    if (!c[key].is_string()) fail("{}: \"{}\" is not a string", path, key);
    return c[key].get<std::string>();
  }
};

ModelConfig gpt2_from_hf(const HfKeys& k) {
  const std::string& path = k.path;
  ModelConfig m;
  m.family = ModelFamily::GPT2;
  m.d_model = k.integer("n_embd");
  m.n_layer = k.integer("n_layer");
  m.n_head = k.integer("n_head");
  m.vocab_size = k.integer("vocab_size");
  m.max_seq_len = k.has("n_positions") ? k.integer("n_positions") : k.integer("n_ctx");
  m.d_ff = k.has("n_inner") ? k.integer("n_inner") : 0;
  m.norm_eps = k.number("layer_norm_epsilon", 1e-5);
  m.tie_embeddings = k.flag("tie_word_embeddings", true);
  const std::string act = k.word("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    fail("{}: activation_function \"{}\": pentad's GPT-2 uses the tanh GELU (\"gelu_new\")", path,
         act);
  return m;
}

// Mixtral's routing: every layer routes with softmax scores to the top
// num_experts_per_tok experts, weights renormalised to sum to 1; intermediate_size is each
// expert's width.
void mixtral_from_hf(const HfKeys& k, ModelConfig& m) {
  const std::string& path = k.path;
  m.moe_layers = "all";
  m.n_experts = k.integer("num_local_experts");
  m.top_k = k.has("num_experts_per_tok") ? k.integer("num_experts_per_tok") : 2;
  m.d_ff_expert = k.integer("intermediate_size");
  m.moe.score = MoeScore::Softmax;
  m.moe.renormalize = true;
  // pentad's term is per layer with a 1/k (src/model/moe.h): k/L times transformers'.
  m.moe.aux_loss_coef = k.number("router_aux_loss_coef", 0.001) * float(m.top_k) / float(m.n_layer);
  if (m.n_experts < 1 || m.top_k < 1 || m.top_k > m.n_experts)
    fail("{}: num_experts_per_tok {} of num_local_experts {}: each token needs 1 to {} experts",
         path, m.top_k, m.n_experts, m.n_experts);
  if (k.has("sliding_window") && k.integer("sliding_window") < m.max_seq_len)
    fail(
        "{}: sliding_window {} < max_position_embeddings {}: pentad attends to the whole "
        "sequence",
        path, k.integer("sliding_window"), m.max_seq_len);
  // router_jitter_noise (multiplicative noise on the router's input while training) is
  // a training choice that pentad lacks; the weights are the same without it.
}

ModelConfig llama_from_hf(const HfKeys& k, bool mixtral) {
  const nlohmann::json& c = k.c;
  const std::string& path = k.path;
  ModelConfig m;
  // The two differ in their MLPs and in the defaults transformers fills in for absent keys.
  m.family = ModelFamily::LLaMA;
  m.d_model = k.integer("hidden_size");
  m.n_layer = k.integer("num_hidden_layers");
  m.n_head = k.integer("num_attention_heads");
  m.n_kv_head = k.has("num_key_value_heads") ? k.integer("num_key_value_heads") : mixtral ? 8 : 0;
  if (m.n_kv_head == m.n_head) m.n_kv_head = 0;  // the recipe's spelling of plain MHA
  m.vocab_size = k.integer("vocab_size");
  m.max_seq_len = k.has("max_position_embeddings") ? k.integer("max_position_embeddings")
                  : mixtral                        ? 4096 * 32
                                                   : 2048;
  m.norm_eps = k.number("rms_norm_eps", mixtral ? 1e-5 : 1e-6);
  m.tie_embeddings = k.flag("tie_word_embeddings", false);
  // Newer transformers keep rope_theta in rope_parameters.
  const bool nested = k.has("rope_parameters") && c["rope_parameters"].is_object();
  const nlohmann::json& rope = nested ? c["rope_parameters"] : c;
  m.rope_theta = rope.contains("rope_theta") && rope["rope_theta"].is_number()
                     ? rope["rope_theta"].get<float>()
                 : mixtral ? 1e6f
                           : 10000.0f;
  const bool scaled = k.has("rope_scaling") ||
                      (nested && rope.contains("rope_type") && rope["rope_type"] != "default");
  if (scaled) fail("{}: RoPE scaling is set; pentad implements plain RoPE only", path);
  if (k.word("hidden_act", "silu") != "silu")
    fail("{}: hidden_act \"{}\": pentad's LLaMA uses SiLU (SwiGLU)", path,
         k.word("hidden_act", ""));
  if (k.flag("attention_bias", false) || k.flag("mlp_bias", false))
    fail("{}: attention_bias / mlp_bias are set; pentad's LLaMA has no biases", path);
  if (k.has("head_dim") && m.n_head > 0 && k.integer("head_dim") * m.n_head != m.d_model)
    fail(
        "{}: head_dim {} x {} heads != hidden_size {}; pentad needs head_dim = hidden_size / "
        "num_attention_heads",
        path, k.integer("head_dim"), m.n_head, m.d_model);
  if (!mixtral)
    m.d_ff = k.integer("intermediate_size");
  else
    mixtral_from_hf(k, m);
  return m;
}

}  // namespace

ModelConfig model_from_hf(const nlohmann::json& c, const std::string& path) {
  if (!c.is_object()) fail("{}: not a JSON object", path);
  const HfKeys keys{c, path};
  const std::string type = keys.word("model_type", "");
  ModelConfig m;
  if (type == "gpt2") {
    m = gpt2_from_hf(keys);
  } else if (type == "llama" || type == "mixtral") {
    // The two differ in their MLPs and in the defaults transformers fills in for absent keys.
    m = llama_from_hf(keys, type == "mixtral");
  } else {
    fail(
        "{}: model_type \"{}\" is not supported: pentad converts \"gpt2\", \"llama\" and "
        "\"mixtral\"",
        path, type);
  }
  m.init_std = keys.number("initializer_range", 0.02);
  return m;
}

}  // namespace pentad::ckpt
