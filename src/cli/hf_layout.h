#pragma once
// What Hugging Face transformers calls pentad's parameters and model keys, both ways: the
// tensor name table and config.json (convert.cpp moves the bytes). The name map itself is
// in convert.h.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli/checkpoint_params.h"
#include "model/config.h"
#include "model/param_table.h"

namespace pentad::ckpt {

// One HF tensor: pentad parameters stacked along their first (out) dim, then transposed
// for GPT-2's Conv1D ([in, out]). Most entries have one part; GPT-2's c_attn has q, k, v.
struct HfEntry {
  std::string hf;
  bool transposed = false;
  std::vector<std::pair<std::string, Dims>> parts;  // pentad name, shape

  Dims hf_shape() const;
};

// The transformers model_type that holds `m`: "gpt2", "llama", or "mixtral" (a LLaMA whose
// every layer is an MoE layer).
std::string hf_model_type(const ModelConfig& m);

// Throws pentad::Error, naming the recipe key, when transformers has no model equal to `m`
// (a GPT-2 with grouped-query attention or experts; an MoE LLaMA that Mixtral does not
// compute: shared experts, sigmoid scores, no renormalisation, dense layers). `where`
// names the checkpoint in the message.
void check_hf_exportable(const ModelConfig& m, const std::string& where);

// Every HF tensor of `m`, in the order they are written.
std::vector<HfEntry> hf_table(const ModelConfig& m);
// The same for the parameters of `table` (param_table(m), or one a test extends); throws
// pentad::Error naming a parameter that has no transformers name.
std::vector<HfEntry> hf_table(const ModelConfig& m, const ParamTable& table);

// pentad parameters that transformers has no place for, each (name, shape): an MoE layer's
// expert_bias (aux-loss-free balancing steers selection with it; Mixtral has none).
std::vector<std::pair<std::string, Dims>> pentad_only_params(const ModelConfig& m);

// config.json for `m` (GPT2Config, LlamaConfig or MixtralConfig).
nlohmann::ordered_json hf_config(const ModelConfig& m);

// config.json -> pentad's model keys (and, for Mixtral, its [moe] routing); `path` names
// the file in messages. Refuses what pentad cannot represent.
ModelConfig model_from_hf(const nlohmann::json& c, const std::string& path);

}  // namespace pentad::ckpt
