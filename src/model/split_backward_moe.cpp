// An MoE block's backward in two passes (model/moe.h; the model's split is
// model/split_backward.cpp): B, d(block input), and W, the router's and routed experts'
// parameter gradients, later. Each grouped GEMM's and the router GEMM's backward runs once
// with dinp (in B) and once with dweight and dbias (in W), as the dense layers' do; the
// kernels compute those parts apart, so every gradient is bitwise MoeBlock::backward's.
//
// B, in backward()'s order: the unpermute's backward (d(rows), d(weights)), the dispatch of
// d(rows) to the experts' ranks (all-to-all), the experts' input gradients, the combine back
// (all-to-all), the unpermute into dx, d(logits) on the host, the router's share of dx.
// W reads what no other pass overwrites before it: the slot's routed rows (MoeBlock::Acts'
// xr, up, gate, act: kept for backward anyway) and the route's per-expert rows, and what B
// keeps in the slot's Acts::deferred, per MoE layer
//   d_yr (R, C): the down projections' output gradients, as received (after the dispatch);
//   d_up, d_gate (R, F): the up (GPT-2: pre-GELU) and gate projections' output gradients;
//   d_logits (Nl, E) F32: the router GEMM's output gradient.
// so W moves nothing between ranks: the experts' rows are already where their weights are.
// The router's input is the layer's norm2 output (the slot's LayerActs); computing in bf16,
// W casts it to fp32 again (router_input), the same values B's cast gave. Under tp (with
// sequence parallelism) and cp the block works on this rank's rows and needs nothing more:
// the model's dense halves (model/split_backward_tp.cpp) reduce and gather around it.
#include "kernels/ops.h"
#include "model/model.h"
#include "model/moe.h"

namespace pentad {

namespace k = kernels;

void declare_moe_deferred(double Nl, double E, double R, double C, double F, DType act, bool gpt2,
                          ActSink& sink, MoeBlock::Acts& a) {
  a.d_yr = sink.add("w_moe_d_yr", {R, C}, act);
  if (!gpt2) a.d_gate = sink.add("w_moe_d_gate", {R, F}, act);
  a.d_up = sink.add("w_moe_d_up", {R, F}, act);
  a.d_logits = sink.add("w_moe_d_logits", {Nl, E}, DType::F32);
}

std::vector<Tensor> MoeBlock::expert_tensors(int Expert::*id, bool grad) const {
  std::vector<Tensor> out;
  for (const Expert& x : experts_) out.push_back(grad ? G(x.*id) : W(x.*id));
  return out;
}

void MoeBlock::backward_input(Acts& a, const Tensor& x, const Tensor& dout, Tensor dx,
                              float weight) {
  const int64_t Nl = rows_, picks = a.picks, received_rows = a.route.recv_rows;
  fit_rows(a.deferred, "moe deferred gradients", picks, received_rows,
           [&](Arena& arena, double, double received) {
             ArenaSink sink(arena);
             declare_moe_deferred(double(Nl), double(E_), received, double(C_), double(F_), act_,
                                  gpt2_, sink, a);
           });
  // backward()'s scratch less what W reads (kept above): rows in the activations' type.
  Tensor dyp, dw, dxr, dxp, dact;
  fit_rows(shared_.backward, "moe backward", picks, received_rows,
           [&](Arena& arena, double sent, double received) {
             const auto A = int64_t(sent), R = int64_t(received);
             dyp = arena.alloc(Shape{A, C_}, act_);
             dw = arena.alloc(Shape{Nl, k_});
             dxr = arena.alloc(Shape{R, C_}, act_);
             dxp = arena.alloc(Shape{A, C_}, act_);
             if (!gpt2_) dact = arena.alloc(Shape{R, F_}, act_);
           });
  k::moe_unpermute_backward(dyp, dw, dout, a.yp, a.pos, a.w);
  ep_.dispatch(a.route, dyp, a.d_yr);
  experts_backward_input(a, dxr, dact);
  ep_.combine(a.route, dxr, dxp);
  k::moe_unpermute(dx, dxp, a.pos, Tensor{}, true);
  logits_backward(a, dw, a.d_logits, weight);
  router_gemm_backward(x, a.d_logits, dx, Tensor{});
}

// experts_backward()'s input gradients: d(up) (and d(gate)) into the kept a.d_up (a.d_gate),
// d(received rows) into dxr.
void MoeBlock::experts_backward_input(Acts& a, Tensor dxr, Tensor dact) {
  const std::vector<int64_t>& rows = a.route.rows;
  if (gpt2_) {
    k::grouped_linear_backward(a.d_up, {}, {}, a.d_yr, a.act, rows,
                               expert_tensors(&Expert::down, false), false);
    k::gelu_backward(a.d_up, a.d_up, a.up);
    k::grouped_linear_backward(dxr, {}, {}, a.d_up, a.xr, rows, expert_tensors(&Expert::up, false),
                               false);
  } else {
    k::grouped_linear_backward(dact, {}, {}, a.d_yr, a.act, rows,
                               expert_tensors(&Expert::down, false), false);
    k::swiglu_backward(a.d_gate, a.d_up, dact, a.gate, a.up);
    k::grouped_linear_backward(dxr, {}, {}, a.d_gate, a.xr, rows,
                               expert_tensors(&Expert::gate, false), false);
    k::grouped_linear_backward(dxr, {}, {}, a.d_up, a.xr, rows, expert_tensors(&Expert::up, false),
                               true);
  }
}

void MoeBlock::backward_weights(Acts& a, const Tensor& x) {
  experts_backward_weights(a);
  router_gemm_backward(x, a.d_logits, Tensor{}, G(router_));
}

// experts_backward()'s parameter gradients (every etp rank sums GPT-2's replicated down bias,
// as there), from the kept output gradients and the rows they multiply.
void MoeBlock::experts_backward_weights(const Acts& a) {
  const std::vector<int64_t>& rows = a.route.rows;
  const std::vector<Tensor> down = expert_tensors(&Expert::down, false);
  k::grouped_linear_backward(Tensor{}, expert_tensors(&Expert::down, true),
                             gpt2_ ? expert_tensors(&Expert::down_b, true) : std::vector<Tensor>{},
                             a.d_yr, a.act, rows, down, false);
  if (!gpt2_)
    k::grouped_linear_backward(Tensor{}, expert_tensors(&Expert::gate, true), {}, a.d_gate, a.xr,
                               rows, expert_tensors(&Expert::gate, false), false);
  k::grouped_linear_backward(Tensor{}, expert_tensors(&Expert::up, true),
                             gpt2_ ? expert_tensors(&Expert::up_b, true) : std::vector<Tensor>{},
                             a.d_up, a.xr, rows, expert_tensors(&Expert::up, false), false);
}

// ---- the model's side: an MoE layer's B and W around the block's ----

// layer_backward()'s routed half: g.norm_local holds the shared experts' d(norm2 output)
// (none: zeroed here), the block adds its own; g.resid still holds d(layer output).
void Model::split_moe_input(int l, const LayerActs& a, MoeBlock::Acts* moe, float moe_weight) {
  PENTAD_CHECK(moe != nullptr, "layer {}: MoE activations missing", l);
  const LayerGrads& g = scratch_.grads;
  if (layer_ffn_[size_t(l)] == 0) k::zero(g.norm_local);
  moe_[size_t(l)]->backward_input(*moe, moe_input(a), g.resid, g.norm_local, moe_weight);
}

void Model::split_moe_weights(int l, const LayerActs& a, MoeBlock::Acts* moe) {
  PENTAD_CHECK(moe != nullptr, "layer {}: MoE activations missing", l);
  moe_[size_t(l)]->backward_weights(*moe, moe_input(a));
}

}  // namespace pentad
