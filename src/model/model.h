#pragma once
// The decoder-only transformer, written for one device: GPT-2 (LayerNorm, GELU, learned
// positions, tied embeddings, biases) or LLaMA (RMSNorm, SwiGLU, RoPE, grouped-query
// attention, untied embeddings, no biases), chosen by ModelConfig::family.
// Forward and backward are explicit, layer by layer; every activation lives in one arena
// planned for a fixed micro-batch (b, t).
//
// Cut for several devices (model/sharding.h): with tensor-parallel hooks of degree p, this
// rank holds 1/p of the heads (q, k, v column-parallel, o row-parallel), of the MLP width
// (up/gate column, down row) and of the vocabulary (embedding and head, with a
// vocabulary-parallel cross-entropy), and calls the hooks where the pieces must talk.
// Degree 1 is the single-device model; the same code runs both.
//
// A rank may hold only some layers, as one or more chunks, each a contiguous range of layers
// (the pipeline's stages, chosen by parallel/pp). The chunk starting at layer 0 holds the
// embedding, the one ending at the last layer the final norm, head and loss. A chunk has
// activation slots, one per micro-batch its caller keeps in flight (add_slot makes one; which
// slot is free is the caller's business). Without pipelining there is one chunk, all layers,
// and one slot.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <vector>

#include "core/device_memory.h"
#include "core/params.h"
#include "model/activations.h"
#include "model/config.h"
#include "model/kv_cache.h"
#include "model/moe.h"
#include "model/param_table.h"
#include "model/sharding.h"

namespace pentad {

// The values of an F32 or BF16 tensor on any device, as host floats into out (numel of them;
// BF16 widened exactly). A device tensor is read back: the host waits.
void read_floats(const Tensor& t, float* out);

// Training FLOPs per token (forward + backward = 3 x forward, 2 per multiply-add; matmuls and
// causal attention, recomputation not counted) of one layer (`moe`: an MoE layer, its shared
// and top_k routed experts and router) and of the head, before any tensor-parallel split;
// `keys`: the whole sequence a query may attend to (each query meets keys / 2 on average).
// Model::flops_per_micro_batch and the planner (plan/cost_model.h) both count with these.
double layer_flops_per_token(const ModelConfig& cfg, bool moe, double keys);
double head_flops_per_token(const ModelConfig& cfg);

// Called during backward: gradients at element offsets [offset, end) of the gradient arena
// are final for this micro-batch (data parallelism starts reducing them). Also called again
// with the offset last given, between a layer's GEMMs, so that reductions under way progress
// (host collectives move only inside the caller's calls: pentad's ring, and MPI without a
// progress thread).
using GradsReady = std::function<void(int64_t offset)>;

// A contiguous range of layers run together; first: it starts with the embedding (layer
// 0); last: it ends with the final norm, the head and the loss (the last layer).
struct LayerRange {
  int64_t layer_begin = 0, layer_end = 0;
  bool first = true, last = true;
};

class Model {
 public:
  // sharding: how this rank's copy is cut (default: one device); its hooks outlive the model.
  // layout: this rank's layer ranges in parameter order (empty: every layer, one chunk).
  // placement: the device every parameter and activation lives on, and the compute type
  // (activations and their gradients in it; statistics, losses and parameter gradients F32).
  // Token ids come from host memory and losses return to it; everything else stays put.
  Model(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_len, Sharding sharding = {},
        std::vector<LayerRange> layout = {}, Placement placement = {});
  // The same with the parameters of `table` (param_table(cfg), or one a test extends; an
  // MoE layer's router and experts come from MoeBlock's own reading of the table).
  Model(const ModelConfig& cfg, ParamTable table, int64_t micro_batch, int64_t seq_len,
        Sharding sharding = {}, std::vector<LayerRange> layout = {}, Placement placement = {});

  // ---- one chunk holding the whole model ----
  // Mean cross-entropy of the micro-batch. tokens, targets: (b, t). When dloss != 0 the
  // forward also runs the head's and the final norm's backward for (dloss * sum of token
  // losses): their parameter gradients are added (+=), and d(last residual) is kept for
  // backward(). So the logits need no slot of their own (model.cpp's head_backward).
  float forward(const int32_t* tokens, const int32_t* targets, float dloss);
  // Accumulates parameter gradients (+=) for the last forward, which must have had dloss != 0.
  // last_micro_batch: the step's gradients are complete after this backward, so replicated
  // parameters whose gradients are partial per tp rank (norms, under sequence parallelism)
  // are summed over tp, and on_ready (if given) hears of each finished range.
  void backward(bool last_micro_batch = true, const GradsReady& on_ready = {});
  Tensor logits() const;  // (b*t, V); holds d(logits) after a training forward

  // ---- decoding with a cache of keys and values (model/decode.cpp) ----
  // Runs `tokens` (n >= 1 new ids, at positions cache.length() ..  + n - 1) through every
  // layer, one row each, appends their keys and values to the cache and returns the logits
  // (V) of the last one: the training forward's logits at that position, computed from the
  // cached rows instead of the whole prefix. A prompt goes in as one call (prefill), each
  // generated token as one more. The same parameters; no training buffer is touched.
  // One device holding every layer (the CPU in fp32, or CUDA in fp32 or bf16); MoE layers
  // route without a capacity. The view (host memory) is valid until the next call with
  // this cache.
  std::span<const float> decode(KvCache& cache, std::span<const int32_t> tokens);

  // ---- chunks and slots (pipeline parallelism) ----
  int chunks() const { return static_cast<int>(chunks_.size()); }
  const LayerRange& chunk(int c) const { return chunks_[static_cast<size_t>(c)].range; }
  // A new activation slot of chunk c (every chunk has one from the start); returns its index.
  int add_slot(int c);
  // The chunk's input (resid[0]) and output residual streams, (rows, C) each: what crosses
  // stages (with sequence parallelism, only this tp rank's rows).
  Tensor chunk_input(int c, int slot) const;
  Tensor chunk_output(int c, int slot) const;
  // Forward of chunk c on the micro-batch in `slot`: the first chunk embeds `tokens`, the
  // others start from chunk_input; the last chunk returns the mean loss against `targets`
  // (others return 0). Either pointer may be null where it is not read; both are host memory.
  float forward_chunk(int c, int slot, const int32_t* tokens, const int32_t* targets, float dloss);
  // Backward of chunk c: the last chunk starts from the d(chunk output) its forward kept
  // (forward_chunk with dloss != 0 runs the head's backward), the others from
  // d_output (rows, C). Afterwards input_grad() holds d(chunk input) until the next backward.
  void backward_chunk(int c, int slot, const Tensor& d_output, bool last_micro_batch,
                      const GradsReady& on_ready = {});
  Tensor input_grad() const { return scratch_.grads.resid; }
  // ---- backward in two passes (zero-bubble pipelines; model/split_backward.cpp) ----
  // backward_chunk split into B, the input gradients (what the chunk below waits for), and
  // W, the parameter gradients (which can wait). B: as backward_chunk, d_output in and
  // input_grad() out, and the norms' parameter gradients (computed with their input
  // gradients, as backward_chunk computes them); it keeps every output gradient W reads in
  // the slot: the column-parallel GEMMs' over activations only B reads (q, k, v, up, gate),
  // the rest (DeferredGrads and the embedding's) over res1 and the residual streams without
  // sequence parallelism, else (and d(att_out) under recompute) in an arena allocated on the
  // slot's first B (deferred_bytes()). The slot's activations and those gradients stay until
  // W: the slot's next forward and B are refused before it. W: the GEMMs' parameter gradients (+=)
  // of the slot's last B, bitwise what backward_chunk accumulates; last_micro_batch and
  // on_ready as backward_chunk's (on_ready hears of the same offsets in the same order). B and
  // W of different chunks and slots interleave freely; each slot's W follows its own B.
  // Dense layers, under tensor parallelism (1D and 2D, with or without sequence
  // parallelism) and context parallelism too: B makes every collective the input gradients
  // need, W none but the last micro-batch's sum of partial replicated gradients (the norms'
  // under sequence parallelism, which the B passes before it added up; as backward_chunk's).
  // MoE layers too, over any ep: B makes the dispatch's all-to-alls, W none (what it reads
  // kept in the slot's MoeBlock::Acts). Under recompute B rebuilds each layer's activations
  // first, as backward_chunk does, and keeps in the slot's arena those W reads (the GEMMs'
  // inputs). Under ZeRO-3 B and W each gather the parameters they read (the parameter hooks).
  void backward_chunk_input(int c, int slot, const Tensor& d_output);
  void backward_chunk_weights(int c, int slot, bool last_micro_batch,
                              const GradsReady& on_ready = {});
  size_t deferred_bytes() const;  // every slot's kept output gradients (B to W)
  // A split backward whose schedule orders the Ws of this rank's chunks differently from
  // run to run (zb-v's lists follow measured costs, and its first stage holds both uses of a
  // tied embedding): the head's share of the tied gradient adds up apart and joins wte's at
  // the embedding's last W of the step, so wte's gradient sums in one order whatever the
  // order of the two chunks' Ws (then no longer bitwise the fused backward's order, which
  // alternates the two per micro-batch). Off by default.
  void set_tied_head_apart(bool apart) { tied_head_apart_ = apart; }
  // ZeRO-2 and -3 under pipelining: every backward_chunk and backward_chunk_weights finishes
  // its parameter gradients as the step's last does (replicated partial ones summed over tp,
  // on_ready told of each range), since each pass's are reduced after it; last_micro_batch
  // then only marks the step's last (where the tied head's gradient joins wte's). Off by
  // default.
  // A split backward's B then writes the norms' parameter gradients into buffers of the
  // slot's own, which its W adds to the parameters': between passes no gradient of the arena
  // is held (ZeRO-2's buckets stay unbacked from B to W), and each W adds its own micro-batch's
  // whatever the lists interleave (bitwise resume).
  void set_reduce_each_pass(bool each) { reduce_each_pass_ = each; }
  // Pipelining: where each chunk's parameters begin in the arena (chunks() + 1 values, the
  // last the arena's size): a chunk's are contiguous, in chunk order.
  std::vector<int64_t> chunk_param_offsets() const;
  // Training on a device (train/trainer.cpp, the step's one readback): with a total set
  // (one F64 on the model's device), each loss-holding forward adds its mean loss into it
  // on the device and returns 0 instead of reading the losses back and waiting. Unset
  // (empty), forward reads them back. Token uploads never wait (UploadStaging); the owner
  // calls rewind_uploads() after each readback that synchronised the device.
  void set_loss_total(const Tensor& total) { loss_total_ = total; }
  void rewind_uploads() { uploads_.rewind(); }
  // Called after every layer's forward and backward (a pipeline polls transfers there).
  void set_progress(std::function<void()> progress) { progress_ = std::move(progress); }
  // ZeRO-3: told which parameters each stretch of forward and backward reads (not owned;
  // outlives the model; none: every parameter is always whole here).
  void set_parameter_hooks(ParameterHooks* hooks) { param_hooks_ = hooks ? hooks : &no_hooks_; }
  ParameterHooks* parameter_hooks() const { return param_hooks_; }
  // The parameter ids of each stretch the hooks are told of, in forward order: the
  // embedding, each layer, the final norm and head (those of this rank's chunks).
  std::vector<std::vector<int>> stretches() const;
  int slots_made(int c) const;
  size_t slot_bytes(int c) const;
  int64_t rows() const { return rows_; }

  // Whether parameter id's gradient is the same on every tp rank (replicated parameters)
  // or this rank's shard of it; the global gradient norm counts replicated ones once.
  bool tp_sharded(int id) const { return params_.spec(id).shard_dim >= 0; }
  const TensorParallelHooks& tp() const { return *tp_; }
  const ContextParallelHooks& cp() const { return *cp_; }
  // The id of this rank's tied-embedding copy (a last chunk on another stage than the
  // first), or -1: its gradient must be summed with the first stage's wte.
  int embedding_copy() const { return embedding_copy_; }
  int embedding() const { return wte_; }

  // ---- Mixture of Experts (model/moe.h) ----
  // What this rank's MoE layers saw since the last call (then reset).
  MoeStats take_moe_stats();
  // Aux-loss-free balancing after a step: counts (as take_moe_stats's, summed over the job).
  void update_expert_bias(const std::vector<double>& counts);
  // The parameter ids of the expert biases update_expert_bias() moves, one per MoE layer.
  std::vector<int> expert_bias_ids() const;

  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }
  const ModelConfig& config() const { return cfg_; }
  // Activation memory: shared scratch plus every slot made so far.
  size_t activation_bytes() const;
  // Its buffers as the activation table declares them (model/activations.h): their bytes
  // before each arena rounds them up to its alignment, and how many.
  double declared_activation_bytes() const { return declared_.bytes; }
  int64_t declared_activation_buffers() const { return declared_.buffers; }
  int64_t micro_batch() const { return b_; }
  int64_t seq_len() const { return t_; }
  // Training FLOPs of one micro-batch on this rank (forward + backward, matmuls and
  // attention, of the layers and head held here).
  double flops_per_micro_batch() const;

 private:
  struct LayerParams {
    int norm1_w = -1, norm1_b = -1, q_w = -1, q_b = -1, k_w = -1, k_b = -1, v_w = -1, v_b = -1;
    int o_w = -1, o_b = -1, norm2_w = -1, norm2_b = -1;
    int up_w = -1, up_b = -1, gate_w = -1, down_w = -1, down_b = -1;
    int* id(Role role);  // the field a declaration of this role fills (null: none)
  };
  // One micro-batch's activations in one chunk (model/activations.h), its MoE layers' too.
  struct Slot : SlotActs {
    Arena arena;
    bool head_done = false;           // the forward ran the head's backward (head_backward)
    std::vector<MoeBlock::Acts> moe;  // per layer of the chunk (used by MoE layers)
    float moe_weight = 0.0f;          // the forward's micro-batch weight in the objective
    // A split backward's, from B to W (model/split_backward.cpp): per layer of the chunk, and
    // the first chunk's d(chunk input) for the embedding.
    Arena deferred_arena;
    std::vector<DeferredGrads> deferred;
    Tensor d_input;
    bool weights_pending = false;  // B ran, W not yet
    // Under set_reduce_each_pass, B's norm gradients until W: by parameter id (empty
    // elsewhere), in an arena of their own.
    Arena norm_arena;
    std::vector<Tensor> norm_grads;
  };
  struct ChunkState {
    LayerRange range;
    std::vector<std::unique_ptr<Slot>> slots;
  };
  // The parameters (model/param_table.h) of this rank's chunks, in chunk order.
  void build_params();
  void build_embedding();
  void build_layer(int64_t l);
  void build_final();
  void sync_partial_grads(const std::vector<int>& ids);  // tp all-reduce (sequence parallel)
  // The activations of the scratch and of one slot of a chunk (model/activations.h), into
  // `sink`: a measuring arena's, then the real one's.
  void plan_shared(ActSink& sink);
  void plan_slot(ActSink& sink, const LayerRange& chunk, Slot& slot);
  Slot& slot(int c, int s) const;
  // recomputing: backward rebuilding the layer's activations (model.recompute).
  void layer_forward(int l, const Tensor& x, Tensor out, LayerActs& a, MoeBlock::Acts* moe,
                     float moe_weight, bool recomputing = false);
  // poll: between its GEMMs (may be empty).
  void layer_backward(int l, const Tensor& x, LayerActs& a, MoeBlock::Acts* moe, float moe_weight,
                      const std::function<void()>& poll = {});
  // The split backward's (model/split_backward.cpp): its refusals, its buffers, one layer's
  // B and W.
  void plan_deferred(ActSink& sink, const LayerRange& chunk, Slot& slot);
  LayerActs rebuilt_acts(const DeferredGrads& d) const;  // recompute: where B rebuilds a layer
  // B overwrites a's up and gate with their gradients, which W reads, and leaves d(q), d(k),
  // d(v) in the scratch's g.q, g.k, g.v, which keep_attention_grads then trades with kept's
  // q, k, v (a's, or under recompute the slot's DeferredGrads::inputs); a chunk's B ends with
  // return_attention_scratch on its last layer's.
  void layer_backward_input(int l, const Tensor& x, LayerActs& a, const DeferredGrads& d,
                            MoeBlock::Acts* moe, float moe_weight);
  void keep_attention_grads(LayerActs& kept);
  void return_attention_scratch(LayerActs& top);
  void layer_backward_weights(int l, const LayerActs& a, const DeferredGrads& d,
                              MoeBlock::Acts* moe, const std::function<void()>& poll);
  // An MoE layer's routed experts and router (model/split_backward_moe.cpp): B (d(norm2
  // output) added into g.norm_local; zeroed first without shared experts) and W.
  void split_moe_input(int l, const LayerActs& a, MoeBlock::Acts* moe, float moe_weight);
  void split_moe_weights(int l, const LayerActs& a, MoeBlock::Acts* moe);
  // Their blocks' halves under tensor and context parallelism (model/split_backward_tp.cpp):
  // a dense MLP's and the attention's B (g.resid in, the reduced d(norm output) into
  // g.norm_local, the output gradients W reads into d and a) and W, the embedding's B.
  void split_mlp_input(const LayerParams& p, LayerActs& a, int64_t ffn, const DeferredGrads& d);
  void split_mlp_weights(const LayerParams& p, const LayerActs& a, int64_t ffn,
                         const DeferredGrads& d);
  void split_attention_input(const LayerParams& p, LayerActs& a, const DeferredGrads& d);
  void split_attention_weights(const LayerParams& p, const LayerActs& a, const DeferredGrads& d);
  void split_embedding_input(Slot& s);
  Tensor embedding_weights_input(const Slot& s);
  // B: a row-parallel GEMM's output gradient, d(block output) with its rows made whole (g's
  // backward), kept for W in `kept` (split_backward_tp.cpp says how); returns the whole rows.
  // W: those whole rows from what B kept. Where f's backward finds its partial input gradient.
  Tensor keep_output_grad(const Tensor& kept, const Tensor& local);
  Tensor kept_output_grad(const Tensor& kept);
  Tensor column_input_partial(const Tensor& reduced) const;
  void mlp_forward(const LayerParams& p, LayerActs& a, int64_t ffn, Tensor out);
  void mlp_backward(const LayerParams& p, LayerActs& a, int64_t ffn);
  Tensor moe_input(const LayerActs& a) const;
  void column_gemm(Tensor out, const Tensor& inp, const Tensor& w, const Tensor& bias);
  void row_gemm_backward(Tensor dinp, Tensor dweight, Tensor dbias, const Tensor& dout,
                         const Tensor& inp, const Tensor& w, bool sum = true);
  Tensor at_width(const Tensor& t, int64_t ffn) const;  // this rank's rows of the MoE block's input
  Tensor P(int id) const { return id < 0 ? Tensor{} : params_.weight(id); }
  Tensor G(int id) const { return id < 0 ? Tensor{} : params_.grad(id); }
  // Where a split backward's B writes parameter id's gradient (a norm's): G(id), or under
  // set_reduce_each_pass the slot's buffer (norm_grads_ while its B runs); join_norm_grads
  // adds a slot's into G and zeros them.
  Tensor GB(int id) const { return id < 0 || !norm_grads_ ? G(id) : norm_grads_->at(size_t(id)); }
  void norm_grads_of(int c, Slot& s);  // the slot's buffers made (zeros), norm_grads_ on them
  void join_norm_grads(Slot& s, std::initializer_list<int> ids);
  // While it lives, under set_reduce_each_pass: GB writes to slot s's buffers.
  struct NormGradsScope {
    NormGradsScope(Model& m, int c, Slot& s) : model(m) {
      if (m.reduce_each_pass_) m.norm_grads_of(c, s);
    }
    ~NormGradsScope() { model.norm_grads_ = nullptr; }
    NormGradsScope(const NormGradsScope&) = delete;
    NormGradsScope& operator=(const NormGradsScope&) = delete;
    Model& model;
  };
  // The last chunk's forward runs the head's backward; its backward (fused or B) starts from
  // what that left (model.cpp).
  void head_backward(int c, Slot& s);
  void take_chunk_output_grad(int c, int slot_index, Slot& s);
  bool tied_head_apart() const;  // set_tied_head_apart's and this rank holds both uses
  Tensor head_grad();            // where the head's weight gradient adds
  bool gpt2() const { return cfg_.family == ModelFamily::GPT2; }
  bool holds_last() const;

  ModelConfig cfg_;
  ParamTable table_;  // every parameter's name, shape and cut (model/param_table.h)
  int64_t b_, t_;
  Placement placement_;
  DType act_ = DType::F32;    // activations and their gradients
  TensorParallelHooks* tp_;   // never null: one device's no-op hooks by default
  ExpertParallelHooks* ep_;   // never null: every expert local by default
  ContextParallelHooks* cp_;  // never null: the whole sequence here by default
  // Per-rank sizes: heads, kv heads, width of attention outputs, MLP width, vocabulary
  // rows, rows of the replicated regions (b*t, or b*t/p with sequence parallelism).
  int64_t heads_, kv_heads_, att_width_, kv_width_, ffn_, vocab_, rows_;
  // 2D tp: a layer's share of the model width (C / d2; C in 1D), and whether the layers'
  // gathered inputs and partial outputs need buffers apart from this rank's rows (SP or 2D).
  int64_t width_ = 0;
  bool apart_ = false;
  int64_t vocab_start_;  // first vocabulary row held here; -1 when the table is whole
  ParamStore params_;
  int wte_ = -1, wpe_ = -1, normf_w_ = -1, normf_b_ = -1, head_ = -1, embedding_copy_ = -1;
  // set_tied_head_apart's buffer of the head's share of the tied gradient, and the Ws of
  // each use since the last join (model/split_backward.cpp).
  bool tied_head_apart_ = false;
  bool reduce_each_pass_ = false;
  const std::vector<Tensor>* norm_grads_ = nullptr;  // the slot's whose B runs (or none)
  Arena tied_head_arena_;
  Tensor tied_head_grad_;
  int tied_heads_ = 0, tied_embeddings_ = 0;  // forwards, Ws since the last join
  std::vector<LayerParams> layers_;           // every layer; ids -1 where not held here
  std::vector<int64_t> layer_ffn_;  // per layer: this rank's MLP width (MoE: shared experts')
  MoeScratch moe_scratch_;          // the MoE blocks' shared buffers
  std::vector<std::unique_ptr<MoeBlock>> moe_;  // per layer: the MoE block, or null
  std::vector<std::vector<int>> partial_;  // per layer (and last: final norm) ids to sync under SP
  std::vector<ChunkState> chunks_;

  ActSizes sizes_;                  // the activations' sizes on this rank
  Arena shared_;                    // the scratch, used by one pass at a time
  ScratchActs scratch_;             // its buffers
  ActSink declared_;                // counts the buffers of shared_ and every slot's arena
  std::vector<float> host_losses_;  // a device run's per-token losses, copied back
  Tensor loss_total_;               // set_loss_total
  UploadStaging uploads_;           // token and target ids on their way to the device
  std::function<void()> progress_;
  ParameterHooks no_hooks_;
  ParameterHooks* param_hooks_ = &no_hooks_;
  // The parameters each stretch reads: the embedding, each layer (by index), the final
  // norm and the head.
  std::vector<int> embed_ids_, final_ids_;
  std::vector<std::vector<int>> layer_ids_;
};

}  // namespace pentad
