#pragma once
// A Mixture-of-Experts block, written for one device: it takes the place of a layer's
// routed MLP. Expert parallelism enters only through ExpertParallelHooks (model/sharding.h),
// which move the permuted token rows to the ranks holding their experts and back.
//
// Per token x (a row of the layer's normalised input, this rank's rows), in fp32:
//   logits = x Wr^T                         Wr: layers.L.moe.router.weight (E, C)
//   s      = softmax(logits) | sigmoid(logits)              (moe.score)
//   picked = the top_k experts by s + bias, ties to the lower index
//            bias: layers.L.moe.expert_bias (E), steers selection only (never weights)
//   w_j    = s[picked_j] (/ sum_j s[picked_j] when moe.renormalize)
//   out    = sum_j w_j * expert_{picked_j}(x)   (+ the shared experts, run by the model)
// An expert is an MLP of the family's kind and width d_ff_expert: GPT-2's GELU MLP with
// biases (layers.L.moe.experts.E.up.weight/bias, .down.weight/bias) or LLaMA's SwiGLU
// (.gate.weight, .up.weight, .down.weight).
//
// The losses, each over one micro-batch (micro_batch x seq_len = T tokens, whole: the
// shards of a sequence-parallel micro-batch add their counts first), and added to the
// training objective with the micro-batch's weight, like its mean cross-entropy:
//   aux     = aux_loss_coef * E / (k T) * sum_e count_e * sum_t p[t, e]
//   seq_aux = seq_aux_loss_coef / b * sum_seq E / (k t) * sum_e count_seq,e * sum_{t in seq} p[t, e]
//   z       = z_loss_coef / T * sum_t logsumexp(logits_t)^2
// count_e: tokens that picked e (before any capacity drop), a constant; p = s for softmax,
// s / sum_e s for sigmoid. Only p carries a gradient.
// Capacity (moe.capacity_factor = f > 0): expert e keeps at most ceil(f T k / E) of the
// micro-batch's picks, those of highest s (ties: earlier token, then earlier pick); a
// dropped pick adds nothing to its token's output (the other weights stay as they are).
// Counting over the micro-batch, never over a rank's share, keeps every layout equal.
// Aux-loss-free balancing: update_bias() after each step moves bias_e by
// bias_update_rate * sign(mean_count - count_e), counts over the whole step and job.
#include <cstdint>
#include <vector>

#include "core/params.h"
#include "model/config.h"
#include "model/sharding.h"

namespace pentad {

// Whether layer `layer` of `cfg` is an MoE layer (model.moe_layers). Throws pentad::Error
// naming the key when the pattern does not parse.
bool is_moe_layer(const ModelConfig& cfg, int64_t layer);
// Every MoE layer's index, in order.
std::vector<int64_t> moe_layer_indices(const ModelConfig& cfg);
// The routed experts' width (d_ff_expert, or the family's ffn width when 0).
int64_t expert_ffn_dim(const ModelConfig& cfg);

}  // namespace pentad
