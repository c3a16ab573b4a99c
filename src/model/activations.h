#pragma once
// Every activation buffer the model keeps, declared once (llm.c's fill_in_activation_sizes;
// the parameters' half is model/param_table.h): each buffer's name, its shape on one rank
// after the mesh has cut it, and its type, handed to a sink in the order the model lays them
// out. The model allocates them through an arena's sink (model/model_memory.cpp), the memory
// plan (plan/memory_budget.cpp) sums their bytes, and a test lists them. A new activation is
// one more line here (and its use in the forward).
//
// Where each set lives, and for how long:
//   a slot (one micro-batch in flight on a chunk): the batch's token ids, the chunk's
//     layers + 1 residual streams, each layer's LayerActs (kept for its backward; none under
//     model.recompute);
//   the scratch (one pass at a time, shared by every chunk, slot and layer): backward's
//     gradients, the buffers apart from this rank's rows, the head's final norm, logits,
//     losses and cross-entropy statistics (the last chunk's forward runs the head's whole
//     backward, so no slot keeps them; they lie over backward's layer gradients) and, under
//     model.recompute, the one LayerActs that each layer's backward rebuilds first.
//   a split backward's (zero-bubble pipelines), per slot from B to W: the output gradients
//     W reads and, under model.recompute, its inputs (DeferredGrads).
// An MoE layer's routing and routed rows (MoeBlock::Acts, one set per slot) are declared
// with the block (model/moe.h).
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace pentad {

// The sizes the shapes are written in, on one rank: tensor parallelism (tp = d1 x d2) cuts
// heads and MLP widths over d1, a layer's share of the width over d2, the vocabulary over
// tp, and with sequence parallelism the replicated regions' rows over tp; context
// parallelism cuts each sequence's tokens over cp. Doubles, as the parameters' (the memory
// plan sizes recipes whose products would wrap); a model's are whole numbers.
struct ActSizes {
  double b = 0, t = 0;            // micro-batch; tokens of each sequence here (seq_len / cp)
  double N = 0, Nl = 0;           // rows: b t, and those of the replicated regions held here
  double C = 0, Cj = 0;           // model width; a layer's share of it (C / d2)
  double H = 0, Ca = 0, Ckv = 0;  // heads, attention width (H x head_dim), kv width
  double F = 0, Fs = 0;           // MLP width: a dense layer's, an MoE layer's shared experts'
  double V = 0;                   // vocabulary rows
  DType act = DType::F32;         // activations and their gradients (statistics, losses: F32)
  bool gpt2 = false;              // LayerNorm's means; no gate
  bool recompute = false;         // model.recompute
  bool moe = false;               // an MoE model: the routed output apart
  bool vocab_parallel = false;    // tp > 1: the cross-entropy's statistics over the vocabulary
  bool sp = false;                // sequence parallel: the final norm's rows apart
  bool hidden_split = false;      // 2D tp (d2 > 1): an MoE layer's routed rows apart
  bool apart = false;  // SP or 2D: gathered inputs and partial outputs apart from the rows
};
// seq_len: the tokens of each sequence this rank holds (under context parallelism its share).
ActSizes activation_sizes(const ModelConfig& cfg, double micro_batch, double seq_len,
                          double tp_degree, double tp_d2, bool sequence_parallel, DType act);

// Where declarations go: each buffer counted, then handed to make(), which gives the tensor
// to read it through: an arena's (ArenaSink), none (this base: the memory plan counts only)
// or a row of a listing (ActListing).
class ActSink {
 public:
  virtual ~ActSink() = default;
  // One buffer: its name, its shape on this rank and its type.
  Tensor add(const char* name, std::initializer_list<double> shape, DType dtype);
  double bytes = 0;  // of every buffer added, before any arena's alignment
  int64_t buffers = 0;

 protected:
  virtual Tensor make(const char* name, std::initializer_list<double> shape, DType dtype);
};

// The bytes of the buffers `declare` (a callable taking an ActSink&) declares.
template <typename Declare>
double bytes_of(const Declare& declare) {
  ActSink sink;
  declare(sink);
  return sink.bytes;
}

// Allocates each buffer in `arena` (a measuring arena first, to size the real one).
class ArenaSink final : public ActSink {
 public:
  explicit ArenaSink(Arena& arena) : arena_(arena) {}

 protected:
  Tensor make(const char* name, std::initializer_list<double> shape, DType dtype) override;

 private:
  Arena& arena_;
};

// The declarations as rows, for reading (tests, a printed table).
struct ActRow {
  std::string name;
  std::vector<double> shape;
  DType dtype = DType::F32;
};
class ActListing final : public ActSink {
 public:
  std::vector<ActRow> rows;

 protected:
  Tensor make(const char* name, std::initializer_list<double> shape, DType dtype) override;
};

// One layer's saved activations. In 2D tp the gathered norm outputs are their columns j.
// A split backward's B overwrites q, k, v, up and gate with their gradients, for its W
// (model/split_backward.cpp).
struct LayerActs {
  Tensor norm1, norm1_mean, norm1_rstd;  // (N, Cj) whole rows, (Nl), (Nl)
  Tensor q, k, v;                        // (N, Ca), (N, Ckv), (N, Ckv); after RoPE (llama)
  Tensor att, lse;                       // (N, Ca), (b, H, t)
  Tensor res1;                           // (Nl, C): input + attention block
  Tensor norm2, norm2_mean, norm2_rstd;  // (N, Cj), (Nl), (Nl)
  Tensor norm2_rows;     // (Nl, C): 2D tp's MoE layers, the routed experts' input kept apart
  Tensor up, gate, act;  // (N, F) each; gpt2: up = fc pre-GELU, act = GELU(up)
};
// Backward's gradients, shared by every layer.
struct LayerGrads {
  Tensor resid;             // (Nl, C): d(residual stream), this rank's rows
  Tensor full;              // (N, C): resid made whole (apart only; else resid)
  Tensor norm, norm_local;  // (N, C) partial d(norm output); (Nl, C) reduced (apart only)
  Tensor att, q, k, v, up, gate, act;  // as LayerActs', at the widest MLP held here
};
// What a backward split in two passes (model/split_backward.cpp) keeps of one layer from
// B (the input gradients) to W (the weight gradients) beyond the slot's activations: the two
// row-parallel GEMMs' output gradients. B computes the norms' weight gradients itself (with
// their input gradients, as the fused backward), and writes the column-parallel GEMMs' output
// gradients over activations only B reads (LayerActs' q, k, v, up, gate: see
// split_backward.cpp), so W's other operands are the slot's LayerActs, kept anyway until W.
// The row-parallel two go over B-only activations too: d(att_out) over the layer's res1 (not
// under recompute: res1 is then the scratch's, and d(att_out) is in the slot's deferred
// arena) and d(out) over the layer's output residual stream, the next layer's input (the
// chunk's output for the last layer). Under tensor parallelism they are kept as B gathered
// them (whole rows, columns j), so W makes no collective for them; under sequence
// parallelism (whose residual stream holds Nl = N / tp rows) as this rank's rows (Nl, C),
// which W gathers again: one all-gather a row-parallel GEMM in W for no arena.
// Under model.recompute the slot keeps no LayerActs: B rebuilds each layer's in the shared
// scratch, which the next layer's B overwrites before W. So B rebuilds straight into
// `inputs` what W reads (the GEMMs' inputs norm1, att, norm2 (2D's MoE layers: norm2_rows),
// act; and q, k, v, up, gate, which B overwrites with their gradients), the rest (the norms'
// statistics, lse, res1) in the scratch: no copy, and the same values as the fused backward.
struct DeferredGrads {
  // The output projection's output gradient, d(res1) gathered: (N, Cj), or under sequence
  // parallelism this rank's rows of d(res1), (Nl, C).
  Tensor d_att_out;
  Tensor d_out;  // the down projection's, as d_att_out (no MLP: none)
  // (Either may be a view of the slot's res1 or residual stream: declare_deferred_layer.)
  LayerActs inputs;  // recompute only: W's operands, as LayerActs' (the others absent)
};
// One micro-batch's activations in one chunk.
struct SlotActs {
  Tensor tokens, targets;       // (b, t) I32
  std::vector<Tensor> resid;    // layers + 1 residual streams (Nl, C); resid[0] = input
  std::vector<LayerActs> acts;  // per layer (empty under recompute: the scratch's)
  // Nothing of the head: the last chunk's forward runs the head's whole backward, so its
  // buffers are the scratch's.
};
// Used by one pass at a time.
struct ScratchActs {
  LayerActs layer;           // recompute: one layer's activations, rebuilt in backward
  Tensor moe_out;            // (Nl, C): the routed output before it joins the residual
  Tensor norm_local;         // (Nl, C): norm output before the SP all-gather (apart only)
  Tensor proj;               // (N, C): row-parallel partial sums before reduction
  Tensor row_max, ce_stats;  // (N), (2, N): vocabulary-parallel cross-entropy
  // The head's (on the rank holding the last chunk), over the backward's d_att .. d_act and
  // beyond them where those are too small: the final norm's output whole (N, C) and this
  // rank's rows (Nl, C; the same buffer without SP), its statistics (Nl), the logits (N, V;
  // d(logits) once the loss is known; kept until the next backward pass) and losses (N).
  Tensor normf, normf_local, normf_mean, normf_rstd, logits, losses;
  LayerGrads grads;
};

// One layer's activations, its MLP ffn wide (an MoE layer: its shared experts', 0 without
// any; the routed experts' are the block's).
void declare_layer(const ActSizes& s, double ffn, bool moe, ActSink& sink, LayerActs& a);
// A slot's token ids and targets.
void declare_batch(const ActSizes& s, ActSink& sink, SlotActs& slot);
// One residual stream (a slot holds its chunk's layers + 1).
Tensor declare_residual(const ActSizes& s, ActSink& sink);
// One layer's DeferredGrads, its MLP ffn wide (an MoE layer, moe: its shared experts', 0
// without any: no MLP buffers; the routed experts' are declare_moe_deferred's, model/moe.h).
// Under recompute (s.recompute) W's operands too. Without sequence parallelism d(att_out) is
// a view of res1 (not under recompute) and d(out) one of out (the layer's output residual
// stream), nothing declared for them: B writes each after its last read of what it replaces.
// res1 and out are the slot's (absent for the memory plan, which counts what is declared).
void declare_deferred_layer(const ActSizes& s, double ffn, bool moe, const Tensor& res1,
                            const Tensor& out, ActSink& sink, DeferredGrads& d);
// A split backward's chunk ends: the first chunk's d(chunk input) whole (N, C: under sequence
// parallelism B gathers it, so that the embedding's W needs no collective); without sequence
// parallelism a view of `input` (the slot's resid[0], which B reads last in layer 0's norm1
// backward, before d(chunk input) is written; nothing declared). The last chunk keeps
// nothing more: its forward ran the head's and the final norm's whole backward.
void declare_deferred_ends(const ActSizes& s, bool first, const Tensor& input, ActSink& sink,
                           Tensor& d_input);
// The scratch, its MLP buffers widest_ffn wide (the widest MLP of the layers held here);
// holds_last: this rank holds the head (its final norm, logits and losses, one micro-batch's,
// laid over the backward's layer gradients: what they need beyond those is
// head_scratch_extra_bytes).
double head_scratch_extra_bytes(const ActSizes& s, double widest_ffn);
void declare_scratch(const ActSizes& s, double widest_ffn, bool holds_last, ActSink& sink,
                     ScratchActs& scratch);

}  // namespace pentad
