#pragma once
// `pentad ckpt convert`: pentad checkpoints to and from Hugging Face transformers
// (safetensors + config.json) and to llm.c's GPT-2 model file. Like torchtitan's
// checkpoint adapters, these are name-and-layout translations only: every value is copied
// (or transposed) exactly, so pentad -> HF -> pentad gives back the same bits.
//
// Name map (pentad (out, in) linear weights; HF GPT-2's Conv1D stores [in, out]):
//   gpt2                      HF GPT2LMHeadModel ("transformer." before all but lm_head)
//   wte.weight, wpe.weight    transformer.wte.weight, transformer.wpe.weight
//   layers.i.norm1.*          transformer.h.i.ln_1.*
//   layers.i.attn.{q,k,v}.*   transformer.h.i.attn.c_attn.{weight [C, 3C] = [Wq^T Wk^T Wv^T],
//                             bias}
//   layers.i.attn.o.*         transformer.h.i.attn.c_proj.*      (weight transposed)
//   layers.i.norm2.*          transformer.h.i.ln_2.*
//   layers.i.mlp.up.*         transformer.h.i.mlp.c_fc.*         (weight transposed)
//   layers.i.mlp.down.*       transformer.h.i.mlp.c_proj.*       (weight transposed)
//   norm_f.*                  transformer.ln_f.*
//   lm_head.weight            lm_head.weight         (untied only)
//
//   llama                     HF LlamaForCausalLM
//   wte.weight                model.embed_tokens.weight
//   layers.i.norm1.weight     model.layers.i.input_layernorm.weight
//   layers.i.attn.{q,k,v,o}   model.layers.i.self_attn.{q,k,v,o}_proj.weight
//   layers.i.norm2.weight     model.layers.i.post_attention_layernorm.weight
//   layers.i.mlp.{gate,up,down}  model.layers.i.mlp.{gate,up,down}_proj.weight
//   norm_f.weight             model.norm.weight
//   lm_head.weight            lm_head.weight         (omitted when tied)
//
//   llama with experts in every layer    HF MixtralForCausalLM: as llama, but in each layer
//   layers.i.moe.router.weight (E, C)    model.layers.i.block_sparse_moe.gate.weight
//   layers.i.moe.experts.e.gate.weight   model.layers.i.block_sparse_moe.experts.e.w1.weight
//   layers.i.moe.experts.e.down.weight   model.layers.i.block_sparse_moe.experts.e.w2.weight
//   layers.i.moe.experts.e.up.weight     model.layers.i.block_sparse_moe.experts.e.w3.weight
//   layers.i.moe.expert_bias (E)         (none: export requires it zero, import writes zeros)
#include <cstdint>
#include <string>

namespace pentad::ckpt {

// Reads the parameters ("param/<name>") and recipe of the committed checkpoint directory
// `checkpoint_dir` and writes out_dir/model.safetensors (F32, HF names) and
// out_dir/config.json (GPT2Config or LlamaConfig). Returns a one-line summary.
// An MoE model of the llama family exports as MixtralForCausalLM (num_local_experts,
// num_experts_per_tok, intermediate_size = the experts' width, router_aux_loss_coef =
// moe.aux_loss_coef). Throws pentad::Error for a model HF cannot represent (a GPT-2 with
// grouped-query attention or experts; an MoE that Mixtral does not compute: dense layers,
// shared experts, sigmoid scores, no renormalisation, a nonzero expert_bias), naming the
// recipe key, or an unreadable checkpoint.
// out_dir must not exist, or be an empty directory, unless overwrite (refuse_to_replace).
// The tokenizer goes with the weights: `tokenizer` if given, else the one the checkpoint
// carries, else the recipe's file where it exists. A tokenizer.json is written with a
// tokenizer_config.json (PreTrainedTokenizerFast, its end-of-text token), so that
// AutoTokenizer.from_pretrained(out_dir) loads it; a SentencePiece model as tokenizer.model
// alone (the summary says so).
std::string export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                      bool overwrite = false, const std::string& tokenizer = "");

// Throws pentad::Error, naming `out` and --overwrite, where `out` exists and is not an
// empty directory (a file, or a directory holding anything) and overwrite is false: an
// export never replaces another quietly (import refuses an existing step the same way).
void refuse_to_replace(const std::string& out, bool overwrite);

// Reads hf_dir/config.json and hf_dir/model.safetensors (or, without it, every
// *.safetensors in hf_dir), builds the matching recipe (model keys from config.json, every
// other key its default) and writes a committed one-rank checkpoint of the parameters only
// (no optimizer moments) at checkpoint_dir(checkpoint_root, step), and that recipe as
// checkpoint_root/recipe.toml (refusing to replace a different one there). Accepts names
// with and without the base model's prefix ("transformer.", "model.") and ignores the
// attention-mask buffers.
// A Mixtral becomes a llama-family recipe with model.moe_layers = "all", n_experts, top_k,
// d_ff_expert, moe.score = "softmax", moe.renormalize = true and moe.aux_loss_coef from
// config.json, and zero expert_bias tensors.
// Refuses an unknown model_type, features pentad lacks (rope scaling, biases in LLaMA,
// another activation, Mixtral's sliding window), missing tensors, wrong shapes and unused
// tensors, naming them.
// Returns a one-line summary.
std::string import_hf(const std::string& hf_dir, const std::string& checkpoint_root,
                      int64_t step = 0);

// Writes llm.c's GPT-2 model file (fp32, version 3: train_gpt2.c's gpt2_build_from_checkpoint
// reads it) from a GPT-2 checkpoint with tied embeddings, 4C MLP and n_kv_head = n_head.
// Refuses other models with a message saying why. Returns a one-line summary.
// out_path must not exist unless overwrite (refuse_to_replace).
std::string export_llmc(const std::string& checkpoint_dir, const std::string& out_path,
                        bool overwrite = false);

}  // namespace pentad::ckpt
