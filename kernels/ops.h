#pragma once
// Backend-neutral kernel entry points. Each checks its preconditions (device, dtype,
// shape) at the door and dispatches to the backend that owns the tensors: kernels/cpu/
// today, kernels/cuda/ when built with CUDA. Callers never branch on the backend.
//
// Each family below is defined in its own file (linear.cpp, norms.cpp, activations.cpp,
// rope.cpp, attention.cpp, crossentropy.cpp, embedding.cpp, elementwise.cpp, optim.cpp, moe.cpp),
// and every one goes through the same door (kernels/door.h): the checks and the backend choice.
//
// Conventions
//  - Row-major, contiguous. N = rows (b*t tokens), C = channels, OC = output channels.
//  - Linear weights are (OC, C) as in PyTorch: out = inp @ weight^T + bias.
//  - Attention tensors are (b, t, heads, head_dim): the natural output of a linear layer.
//  - Gradients of parameters ACCUMULATE (+=): they are zeroed once per optimizer step,
//    so gradient accumulation over micro-batches is free. Gradients of activations are
//    overwritten unless the argument says "accumulate".
//  - An empty Tensor (data == nullptr) means "absent" (no bias, no positions, ...).
//  - F32 everywhere in training; every CPU kernel also accepts F64 so that tests can
//    check backward passes against finite differences in double precision.
//  - CPU kernels use every OpenMP thread and are bitwise deterministic for a fixed
//    thread count (static partitions, no atomics, fixed reduction order).
//  - CUDA tensors (all of a call's tensors on the device) run the kernels of kernels/cuda/:
//    data in F32 or BF16 with F32 accumulation; per-row statistics (mean, rstd, lse,
//    losses, row_max, stats), parameter gradients and AdamW state in F32. They are
//    deterministic too. kernels/cuda/cuda_ops.h has the stream rule and the limits.
#include <cstdint>
#include <span>

#include "core/params.h"
#include "core/tensor.h"

namespace pentad::kernels {

// out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC)
void linear_forward(Tensor out, const Tensor& inp, const Tensor& weight, const Tensor& bias);
// pre_gelu (N, OC) = inp @ weight^T + bias; out (N, OC) = gelu(pre_gelu). On CUDA one
// cuBLASLt GEMM with the GELU epilogue where it applies (OC a multiple of 8).
void linear_gelu_forward(Tensor out, Tensor pre_gelu, const Tensor& inp, const Tensor& weight,
                         const Tensor& bias);
// dinp (N, C) = dout @ weight (or += when accumulate_dinp); dweight (OC, C) += dout^T @ inp;
// dbias (OC) += column sums of dout. dinp/dweight/dbias may each be absent.
void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight, bool accumulate_dinp);

// The backward of a linear layer whose input was gelu(pre_gelu) (GPT-2's MLP projection):
// dpre_gelu (N, C) = (dout @ weight) * gelu'(pre_gelu), overwritten; dweight, dbias as
// linear_backward with inp = gelu(pre_gelu). On CUDA the GELU gradient is cuBLASLt's DGELU
// epilogue where it applies (C a multiple of 8).
void linear_backward_gelu(Tensor dpre_gelu, Tensor dweight, Tensor dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, const Tensor& pre_gelu);

// LayerNorm over the last dim. mean, rstd: (N). dinp +=, dweight +=, dbias +=.
void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, const Tensor& inp,
                       const Tensor& weight, const Tensor& bias, float eps);
// The residual add fused in front: residual = a + b (may alias a), out = layernorm(residual).
// Backward needs nothing new: layernorm_backward's dinp += adds into the residual gradient.
void residual_layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd,
                                const Tensor& a, const Tensor& b, const Tensor& weight,
                                const Tensor& bias, float eps);
void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, const Tensor& dout,
                        const Tensor& inp, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd);

// RMSNorm over the last dim (LLaMA): out = inp * rstd * weight. rstd: (N). dinp +=, dweight +=.
void rmsnorm_forward(Tensor out, Tensor rstd, const Tensor& inp, const Tensor& weight, float eps);
// residual = a + b (may alias a), out = rmsnorm(residual).
void residual_rmsnorm_forward(Tensor residual, Tensor out, Tensor rstd, const Tensor& a,
                              const Tensor& b, const Tensor& weight, float eps);
void rmsnorm_backward(Tensor dinp, Tensor dweight, const Tensor& dout, const Tensor& inp,
                      const Tensor& weight, const Tensor& rstd);

// GELU, tanh approximation (GPT-2). dinp = dout * gelu'(inp); dinp may be dout or inp (each
// value is read before its gradient is written in its place).
void gelu_forward(Tensor out, const Tensor& inp);
void gelu_backward(Tensor dinp, const Tensor& dout, const Tensor& inp);

// SwiGLU (LLaMA): out = silu(gate) * up, all (N, F). dgate, dup overwritten; each may be any
// of dout, gate, up (every input value is read before either gradient is written).
void swiglu_forward(Tensor out, const Tensor& gate, const Tensor& up);
void swiglu_backward(Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up);

// Positions (context parallelism, where a rank holds tokens that are not 0..t-1): an
// optional I32 tensor (t) on the compute device (the data's), ascending, shared by every
// batch row; absent means 0..t-1.

// Rotary embedding in place on x (b, t, heads, head_dim), "rotate half" pairing
// (i, i + head_dim/2) as Hugging Face LLaMA does; token t has position pos_offset + t, or
// positions[t] when positions is given (pos_offset must then be 0). Backward applies the
// inverse rotation to the gradient in place.
void rope_forward(Tensor x, int64_t pos_offset, float theta, const Tensor& positions = {});
void rope_backward(Tensor dx, int64_t pos_offset, float theta, const Tensor& positions = {});

// Causal attention with grouped-query heads: q, out (b, tq, hq, d); k, v (b, tk, hkv, d);
// hq % hkv == 0 and query head h reads kv head h / (hq / hkv). Scale 1/sqrt(d). Query i
// sees key j iff k_pos[j] <= q_pos[i] (both absent: tq == tk and the usual causal mask;
// both or neither are given). lse (b, hq, tq) keeps each row's log-sum-exp for backward
// and for attention_merge. A query that sees no key gets out = 0 and lse = -inf. Never
// materialises b*h*tq*tk: scores are computed in blocks of query rows per (b, h).
void attention_forward(Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& q_pos = {}, const Tensor& k_pos = {});
// The backward of one (q, k/v) block given the FINAL out and lse of the query rows (after
// every block was merged): P = exp(S - lse), D_i = dout_i . out_i, dS = P (dP - D). dq, dk,
// dv are overwritten, or added to when accumulate is true (context parallelism sums the
// blocks' gradients).
void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& q_pos = {}, const Tensor& k_pos = {},
                        bool accumulate = false);
// Which implementation runs attention on CUDA (train.attention); the CPU always runs
// pentad's. Auto: cuDNN's fused flash attention for BF16 calls without positions whose
// shape cuDNN takes, pentad's kernel otherwise. Cudnn: cuDNN for every call without
// positions (F32 data staged through BF16 copies), failing where cuDNN refuses. Pentad:
// pentad's kernel only. Calls with positions (context parallelism's ring blocks) always run
// pentad's kernel: cuDNN's diagonal masks cannot express them. Both implementations write
// the same lse, so a forward from one and a backward from the other agree. Process-wide:
// set before the first step (the trainer sets it from the recipe).
enum class AttentionImpl { Auto, Cudnn, Pentad };
void set_attention_impl(AttentionImpl impl);
AttentionImpl attention_impl();
// Merges one block's (block_out, block_lse) into the running (out, lse), in place:
// lse' = log(exp(lse) + exp(block_lse)); out' = out exp(lse - lse') + block_out
// exp(block_lse - lse'). A -inf on either side is handled: a row no key has seen so far
// stays 0 / -inf. Shapes as attention_forward's out and lse.
void attention_merge(Tensor out, Tensor lse, const Tensor& block_out, const Tensor& block_lse);

// Softmax + cross-entropy fused with its gradient. logits (N, V), targets (N) I32.
// losses (N) = -log softmax(logits)[target]. When dlogits is present it receives
// (softmax - onehot) * dloss (dlogits may alias logits). Returns nothing; callers sum losses.
void crossentropy_forward_backward(Tensor losses, Tensor dlogits, const Tensor& logits,
                                   const Tensor& targets, float dloss);

// Cross-entropy over logits sharded along the vocabulary (tensor parallel): logits (N, Vl)
// hold columns [vocab_start, vocab_start + Vl) of each row. Three local phases around two
// reductions over the shards, so full logits are never gathered:
//   1. row_max (N) = max of the local columns                      -> all-reduce MAX
//   2. stats (2, N) = [sum exp(logit - row_max); target logit or 0] -> all-reduce SUM
//   3. losses (N) and dlogits = (softmax - onehot) * dloss (may alias logits; either absent).
void vocab_parallel_ce_max(Tensor row_max, const Tensor& logits);
void vocab_parallel_ce_stats(Tensor stats, const Tensor& logits, const Tensor& row_max,
                             const Tensor& targets, int64_t vocab_start);
void vocab_parallel_ce_finish(Tensor losses, Tensor dlogits, const Tensor& logits,
                              const Tensor& row_max, const Tensor& stats, const Tensor& targets,
                              int64_t vocab_start, float dloss);

// Token (+ learned position) embedding: out (b, t, C) = wte[tokens] + wpe[t], or
// wpe[positions[t]] when positions is given (backward then scatters dwpe by position).
// tokens (b, t) I32; wpe may be absent. dwte +=, dwpe += (scatter-add, deterministic).
// vocab_start >= 0 means wte holds only rows [vocab_start, vocab_start + wte rows) of the
// table (vocabulary parallel): other tokens give zero rows and no gradient.
void embedding_forward(Tensor out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t vocab_start = -1, const Tensor& positions = {});
void embedding_backward(Tensor dwte, Tensor dwpe, const Tensor& dout, const Tensor& tokens,
                        int64_t vocab_start = -1, const Tensor& positions = {});

// MoE token permutation (src/model/moe.h). out (A, C) = inp[src] (rows; src (A) I32).
void moe_permute(Tensor out, const Tensor& inp, const Tensor& src);
// out (N, C) (+)= per token the weighted sum of its picks' rows of inp (A, C): pick j of
// token t is row pos[t, j] (pos (N, k) I32; -1: dropped), weighted by w[t, j] (w absent: 1).
void moe_unpermute(Tensor out, const Tensor& inp, const Tensor& pos, const Tensor& w,
                   bool accumulate);
// Its backward: dinp[pos[t, j]] = w[t, j] * dout[t]; dw[t, j] = <dout[t], inp[pos[t, j]]>.
void moe_unpermute_backward(Tensor dinp, Tensor dw, const Tensor& dout, const Tensor& inp,
                            const Tensor& pos, const Tensor& w);
// The routed experts' linear layers on rows grouped by expert (MoE's grouped GEMM): group g
// owns the next group_rows[g] rows of inp (R, C) and out (R, OC), with its own weight[g]
// (OC, C) and bias[g] (OC; the list or an entry may be absent): out rows = inp rows @
// weight[g]^T + bias[g], each row's values equal to linear_forward's on the group's rows.
// On the CPU the threads split the R rows evenly whatever the routing and each runs
// single-threaded GEMMs on its share of every group: one parallel region, where a
// multi-threaded GEMM per expert makes the threads meet inside every GEMM. On CUDA: one
// GEMM per group.
void grouped_linear_forward(Tensor out, const Tensor& inp, std::span<const int64_t> group_rows,
                            std::span<const Tensor> weight, std::span<const Tensor> bias);
// Its backward, as linear_backward per group: dinp (R, C) = dout @ weight[g] (+= when
// accumulate_dinp); dweight[g] += dout^T @ inp and dbias[g] += column sums of dout over the
// group's rows. dinp, dweight, dbias may be absent (empty spans: every group's). The
// threads split dinp by rows and each group's dweight by its OC rows, so every element
// sums the group's rows in linear_backward's order.
void grouped_linear_backward(Tensor dinp, std::span<const Tensor> dweight,
                             std::span<const Tensor> dbias, const Tensor& dout, const Tensor& inp,
                             std::span<const int64_t> group_rows, std::span<const Tensor> weight,
                             bool accumulate_dinp);

// out = a + b (out may alias a or b).
void add(Tensor out, const Tensor& a, const Tensor& b);
// x = 0 (every byte). Not scale(x, 0): that keeps a NaN already in x.
void zero(Tensor x);
// x *= s
void scale(Tensor x, float s);
// sum of squares, accumulated in double.
double sum_squares(const Tensor& x);  // on CUDA a readback: the host waits
// Add into total, one F64 on x's device: the sum of x's elements times scale (sum_into), or
// the sum of their squares (sum_squares_into, the value sum_squares(x) returns). In double,
// in an order fixed by x's size, and with no readback: on CUDA nothing waits. The device
// accumulators behind the training step's one readback (train/trainer.cpp).
void sum_into(Tensor total, const Tensor& x, double scale = 1.0);
void sum_squares_into(Tensor total, const Tensor& x);
// out = inp in another element type (same element count): F32, BF16 (round to nearest even)
// and, on the CPU, F64. BF16 tensors on the CPU hold uint16_t (core/bf16.h).
void convert(Tensor out, const Tensor& inp);
// The compute copy of a parameter table follows its F32 master values (nothing to do
// when the table computes in F32).
void refresh_weights(ParamStore& params);

// One AdamW step on a flat region (decoupled weight decay): step counts from 1 for bias
// correction. params, grads, m, v same shape.
void adamw_update(Tensor params, Tensor m, Tensor v, const Tensor& grads, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t step);
// The same step out of place: reads `from`, writes `to` (bitwise what the update in place
// would leave), and leaves `from` untouched, e.g. for a checkpoint that is still reading it.
struct AdamWState {
  Tensor params, m, v;
};
void adamw_update(const AdamWState& from, const AdamWState& to, const Tensor& grads, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step);

}  // namespace pentad::kernels
