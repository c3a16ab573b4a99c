#pragma once
// A Mixture-of-Experts block, written for one device: it takes the place of a layer's
// routed MLP. Expert parallelism enters only through ExpertParallelHooks (model/sharding.h),
// which move the permuted token rows to the ranks holding their experts and back.
//
// Per token x (a row of the layer's normalised input, this rank's rows):
//   logits = x Wr^T                         Wr: layers.L.moe.router.weight (E, C)
//   s      = softmax(logits) | sigmoid(logits)              (moe.score)
//   picked = the top_k experts by s + bias, ties to the lower index
//            bias: layers.L.moe.expert_bias (E), steers selection only (never weights)
//   w_j    = s[picked_j] (/ sum_j s[picked_j] when moe.renormalize)
//   out    = sum_j w_j * expert_{picked_j}(x)   (+ the shared experts, run by the model)
// An expert is an MLP of the family's kind and width d_ff_expert: GPT-2's GELU MLP with
// biases (layers.L.moe.experts.E.up.weight/bias, .down.weight/bias) or LLaMA's SwiGLU
// (.gate.weight, .up.weight, .down.weight).
// Precision: the routing is fp32 always: the router's GEMM reads the fp32 master Wr and an
// fp32 copy of x (cast at the block's door when the model computes in bf16), and its
// gradient is cast back and added into d(x); the scores, picks, weights and losses are host
// logic in fp32. The token rows and the experts run in the model's compute type: in bf16
// (CUDA) the permutation, the experts' grouped GEMMs (their bf16 compute copies, F32
// accumulation) and the activations are bf16, the combine weights and every parameter
// gradient F32, as in the dense layers.
//
// The losses, each over one micro-batch (micro_batch x seq_len = T tokens, whole: the
// shards of a sequence-parallel micro-batch add their counts first), and added to the
// training objective with the micro-batch's weight, like its mean cross-entropy:
//   aux     = aux_loss_coef * E / (k T^2) * sum_e count_e * sum_t p[t, e]
//   seq_aux = seq_aux_loss_coef / b * sum_seq E / (k t^2) * sum_e count_seq,e * sum_{t in seq} p[t,
//   e] z       = z_loss_coef / T * sum_t logsumexp(logits_t)^2
// (E * sum_e f_e P_e with f_e = count_e / (k T) and P_e = mean_t p[t, e]: coef when balanced.)
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
#include "model/activations.h"
#include "model/config.h"
#include "model/sharding.h"

namespace pentad {

// What the MoE layers held here saw since the last Model::take_moe_stats(), training
// forwards only. Counts are of this rank's tokens (ranks hold disjoint tokens, so a sum over
// the job is the global count); the loss values count each micro-batch once (its first tp
// rank adds them), summed over micro-batches and layers.
struct MoeStats {
  int64_t experts = 0;
  std::vector<int64_t> layers;  // MoE layer indices held here
  std::vector<double> counts;   // layers x experts: picks before capacity drops
  std::vector<double> dropped;  // per layer: picks dropped by capacity
  double aux = 0, seq_aux = 0, z = 0;
};

// The most rows an MoE layer's dispatch can move for one micro-batch, which its buffers are
// sized for once and the memory plan counts: A = rows k picks sent; R rows received, each of
// the ep x etp ranks that send here routing all its `rows` here, each to min(k, E / ep) of
// this rank's experts; with a capacity (factor > 0), a local expert takes at most
// min(rows, ceil(factor tokens k / E)) rows from each of them. tokens: the micro-batch's.
struct MoeRowBound {
  double sent = 0, received = 0;
};
MoeRowBound moe_row_bound(double rows, double tokens, double experts, double top_k, double ep,
                          double etp, double capacity_factor);

// Buffers an MoE layer uses within one call (its backward, the router's fp32 copies in a bf16
// model), one set for all of a rank's MoE layers: the model owns them, the memory plan counts
// them once.
struct MoeScratch {
  Arena backward, router;
};

// One MoE layer's router and the experts this rank holds. Its parameters are registered in
// the constructor (in the model's parameter order); forward and backward read them from
// the store once it is allocated.
class MoeBlock {
 public:
  // seq_len: the tokens of each sequence this rank holds (all of them, or its share under
  // context parallelism, whose ranks the micro-batch statistics are summed over too).
  // act: the activations' type (the model's compute type): F32, or BF16 on CUDA. scratch: the
  // buffers shared with the rank's other MoE layers (outlives the block).
  MoeBlock(const ModelConfig& cfg, int64_t layer, ParamStore& params, ExpertParallelHooks& ep,
           TensorParallelHooks& tp, ContextParallelHooks& cp, int64_t micro_batch, int64_t seq_len,
           Device device, DType act, MoeScratch& scratch);

  // One micro-batch's saved routing and expert activations: the routing's tensors keep
  // their size, the rows' are sized at each forward.
  struct Acts {
    Arena routing, rows;
    ExpertRoute route;
    int64_t picks = 0;                    // kept picks of this rank's rows (A)
    Tensor logits, scores, pick, w, pos;  // (Nl, E), (Nl, E), (Nl, k) I32, (Nl, k), (Nl, k) I32
    Tensor src, xp, xr, gate, up, act, yr,
        yp;  // (A) I32, (A, C), (R, C), (R, F) x3, (R, C), (A, C): in the activations' type
    // On CUDA the routing's host copies of logits, scores, pick and w (moe.cpp: host_side);
    // empty on the CPU, where the host logic reads the tensors in place.
    std::vector<float> host_logits, host_scores, host_w;
    std::vector<int32_t> host_pick;
    std::vector<float> lse;        // (Nl): logsumexp of the logits (z-loss)
    std::vector<double> aux_coef;  // (E): d aux / d p[t, e], this micro-batch
    std::vector<double> seq_coef;  // (b, E): d seq_aux / d p[t, e] per sequence
    // A backward in two passes (model/split_backward_moe.cpp): what W reads besides the rows
    // above, kept from B, sized at each B: the experts' output gradients and the router's.
    Arena deferred;
    Tensor d_yr, d_gate, d_up, d_logits;  // (R, C), (R, F) x2 (GPT-2: up alone), (Nl, E) F32
  };

  // x (Nl, C): this rank's rows of the normalised input; out (Nl, C) = the routed output.
  // weight: the micro-batch's weight in the training objective (0: no backward follows and
  // nothing is counted). count = false: a recomputation of a forward already counted.
  void forward(Acts& a, const Tensor& x, Tensor out, float weight, bool count = true);
  // Decoding (Model::decode): out (n, C) = the routed output of n rows x (n, C), any n,
  // routed as forward() without a capacity limit and counting nothing. One device (CPU, or
  // CUDA in fp32 or bf16) holding every expert; the routing reads the logits back (a wait).
  void decode(const Tensor& x, Tensor out);
  // dx (Nl, C) += d(x) from dout (Nl, C); parameter gradients +=.
  void backward(Acts& a, const Tensor& x, const Tensor& dout, Tensor dx, float weight);
  // backward() in two passes (model/split_backward_moe.cpp), together bitwise backward()'s.
  // B: dx += d(x), the dispatch's all-to-alls included; keeps in a.deferred what W reads.
  // W: the router's and the local experts' parameter gradients (+=) of a's last B, from
  // what B kept and a's rows: no communication.
  void backward_input(Acts& a, const Tensor& x, const Tensor& dout, Tensor dx, float weight);
  void backward_weights(Acts& a, const Tensor& x);
  // bias_e += rate * sign(mean - counts[e]) from the job's counts of one step (E values).
  void update_bias(const double* counts);

  int router() const { return router_; }  // parameter ids
  int bias() const { return bias_; }
  // Statistics since the last call to take_stats (counts: E values, then reset).
  void take_stats(std::vector<double>& counts, double& dropped, double& aux, double& seq_aux,
                  double& z);

 private:
  struct Expert {
    int gate = -1, up = -1, up_b = -1, down = -1, down_b = -1;
  };
  // Lays out plan(arena, A, R)'s tensors for this micro-batch's A picks sent and R rows
  // received in `arena`, which is made for the most rows (bound_) of that plan: its size is
  // the memory plan's and stays put while the routing varies.
  template <typename Plan>
  void fit_rows(Arena& arena, const char* name, int64_t A, int64_t R, const Plan& plan) const {
    PENTAD_CHECK(double(A) <= bound_.sent && double(R) <= bound_.received,
                 "{}: {} picks sent and {} rows received, over the bound of {} and {}", name, A, R,
                 bound_.sent, bound_.received);
    Arena measure = Arena::measuring(name);
    plan(measure, bound_.sent, bound_.received);
    if (arena.capacity() < measure.used()) arena = Arena(name, measure.used(), device_);
    arena.reset();
    plan(arena, double(A), double(R));
  }
  // Lays out plan(arena)'s tensors in `arena`: made as large as they need the first time,
  // reallocated half again as large when they do not fit (decoding's rows vary).
  template <typename Plan>
  static void fit(Arena& arena, const char* name, Device device, const Plan& plan) {
    Arena measure = Arena::measuring(name);
    plan(measure);
    if (arena.capacity() == 0 && measure.used() > 0)
      arena = Arena(name, measure.used(), device);
    else if (arena.capacity() < measure.used())
      arena = Arena(name, measure.used() + measure.used() / 2, device);
    else
      arena.reset();
    plan(arena);
  }
  // The router (model/router.h): route() runs its steps, each a method below.
  void route(Acts& a, const Tensor& x, float weight, bool count);
  // Logits (fp32), scores, the top k, weights and each row's logsumexp, into `a`.
  void score(Acts& a, const Tensor& x);
  // The balancing losses' coefficients into `a` (and with count, their values into stats).
  void balance(Acts& a, bool count);
  void drop_over_capacity(Acts& a, std::vector<uint8_t>& kept) const;
  // The kept picks into expert order (a.pos, a.src), the dispatch planned (a.route).
  void permute(Acts& a, const std::vector<uint8_t>& kept);
  void size_routing(Acts& a);
  void size_rows(Acts& a, int64_t picks, int64_t recv_rows);
  void experts_forward(Acts& a);
  // dact, dgate, dup (R, F): scratch (dup alone for GPT-2's experts).
  void experts_backward(Acts& a, const Tensor& dyr, Tensor dxr, Tensor dact, Tensor dgate,
                        Tensor dup);
  void router_backward(Acts& a, const Tensor& x, const Tensor& dw, const Tensor& dlogits, Tensor dx,
                       float weight);
  // Its two halves: d(logits) (F32, (Nl, E)) from dw (Nl, k) and the losses, on the host;
  // then the router GEMM's backward, dx (+=) and drouter (+=) each optional.
  void logits_backward(const Acts& a, const Tensor& dw, const Tensor& dlogits, float weight);
  void router_gemm_backward(const Tensor& x, const Tensor& dlogits, Tensor dx, Tensor drouter);
  // The split's expert halves (model/split_backward_moe.cpp); dxr (R, C) and dact (R, F) scratch.
  void experts_backward_input(Acts& a, Tensor dxr, Tensor dact);
  void experts_backward_weights(const Acts& a);
  // Each local expert's parameter `id`, or its gradient.
  std::vector<Tensor> expert_tensors(int Expert::*id, bool grad) const;
  // x as the router's fp32 input: x itself in fp32, else its cast into router_scratch_.
  Tensor router_input(const Tensor& x);
  Tensor W(int id) const { return id < 0 ? Tensor{} : params_.weight(id); }
  Tensor G(int id) const { return id < 0 ? Tensor{} : params_.grad(id); }

  ModelConfig cfg_;
  MoeConfig moe_;
  ParamStore& params_;
  ExpertParallelHooks& ep_;
  TensorParallelHooks& tp_;
  ContextParallelHooks& cp_;
  int64_t b_, t_, rows_, row_start_;  // micro-batch, sequence, rows held, first row held
  MoeRowBound bound_;                 // the most rows the dispatch moves (moe_row_bound)
  int64_t T_;                         // whole sequence (t_ x cp)
  std::vector<int64_t> token_;        // b_ x t_ rows: the index of each in the micro-batch
  // Sums over the ranks that hold parts of this micro-batch: tp (sequence parallel), cp.
  void sum_over_micro_batch(std::vector<float>& values) const;
  int64_t E_, k_, F_, C_;  // experts, picks per token, expert width here, model width
  Device device_;
  DType act_;  // the token rows' and experts' type
  bool gpt2_;
  int router_ = -1, bias_ = -1;
  std::vector<Expert> experts_;  // the local experts
  // Backward's buffers (the experts' scratch too); in bf16 the router's fp32 input x (Nl, C)
  // F32, its gradient (Nl, C) F32 and that cast back (Nl, C) in the activations' type, laid
  // out in shared_.router at each call (the same for every layer).
  MoeScratch& shared_;
  Tensor x32_, dx32_, dx_act_;
  Arena decode_;  // decode()'s buffers, grown as needed
  // Statistics (training forwards since take_stats).
  std::vector<double> counts_;
  double dropped_ = 0, aux_ = 0, seq_aux_ = 0, z_ = 0;
};

// One micro-batch's routing (`rows` of this rank, E experts, top k picks; fp32 and I32) and
// routed rows (A picks sent, R rows received, experts F wide on this etp rank; in the
// activations' type), declared as the layers' are (model/activations.h): MoeBlock lays them
// out at each forward in buffers made once for moe_row_bound's rows, the memory plan's count.
void declare_moe_routing(double rows, double experts, double top_k, ActSink& sink,
                         MoeBlock::Acts& a);
void declare_moe_rows(double sent, double received, double C, double F, DType act, bool gpt2,
                      ActSink& sink, MoeBlock::Acts& a);
// What a split backward's B keeps for W (MoeBlock::Acts::deferred), for the same rows and
// received rows: laid out by MoeBlock at each B, sized for moe_row_bound's; a memory plan sums
// it per MoE layer and slot waiting for its W.
void declare_moe_deferred(double rows, double experts, double received, double C, double F,
                          DType act, bool gpt2, ActSink& sink, MoeBlock::Acts& a);

// Whether layer `layer` of `cfg` is an MoE layer (model.moe_layers). Throws pentad::Error
// naming the key when the pattern does not parse.
bool is_moe_layer(const ModelConfig& cfg, int64_t layer);
// Every MoE layer's index, in order.
std::vector<int64_t> moe_layer_indices(const ModelConfig& cfg);
// The routed experts' width (d_ff_expert, or the family's ffn width when 0).
int64_t expert_ffn_dim(const ModelConfig& cfg);

}  // namespace pentad
