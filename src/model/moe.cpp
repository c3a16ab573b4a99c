#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "core/device_memory.h"
#include "kernels/ops.h"
#include "model/param_table.h"
#include "model/router.h"

namespace pentad {

namespace k = kernels;

namespace {

// The routing is host logic in fp32 (route, drop_over_capacity, router_backward, update_bias).
// It works on host memory: on the CPU the tensors themselves, with no copy; on CUDA a host
// copy in `mirror` (core/device_memory.h, ordered with the kernels by the stream rule),
// filled from the tensor when `fetch`, sent back with to_device().
template <typename V>
V* host_side(const Tensor& t, std::vector<V>& mirror, bool fetch) {
  if (t.device == Device::CPU) return static_cast<V*>(t.data);
  mirror.resize(static_cast<size_t>(t.numel()));
  if (fetch) copy_bytes(mirror.data(), Device::CPU, t.data, t.device, t.bytes());
  return mirror.data();
}
// Where host_side() left a tensor's values, for reading them again later.
template <typename V>
const V* on_host(const Tensor& t, const std::vector<V>& mirror) {
  return t.device == Device::CPU ? static_cast<const V*>(t.data) : mirror.data();
}
// The host copy back into its device tensor (on the CPU they are one memory).
template <typename V>
void to_device(const Tensor& t, const V* host) {
  if (t.device != Device::CPU) copy_bytes(t.data, t.device, host, Device::CPU, t.bytes());
}

}  // namespace

// ---- the block ----

MoeBlock::MoeBlock(const ModelConfig& cfg, int64_t layer, ParamStore& params,
                   ExpertParallelHooks& ep, TensorParallelHooks& tp, ContextParallelHooks& cp,
                   int64_t micro_batch, int64_t seq_len, Device device, DType act,
                   MoeScratch& scratch)
    : cfg_(cfg),
      moe_(cfg.moe),
      params_(params),
      ep_(ep),
      tp_(tp),
      cp_(cp),
      b_(micro_batch),
      t_(seq_len),
      E_(cfg.n_experts),
      k_(cfg.top_k),
      C_(cfg.d_model),
      device_(device),
      act_(act),
      gpt2_(cfg.family == ModelFamily::GPT2),
      shared_(scratch) {
  PENTAD_CHECK(act == DType::F32 || act == DType::BF16, "MoE activations in {}", dtype_name(act));
  const int64_t N = b_ * t_;
  rows_ = tp_.local_rows(N);
  row_start_ = tp_.sequence_parallel() ? tp_.rank() * rows_ : 0;
  // Row j of this rank is token (j / t, position of j % t) of the micro-batch.
  T_ = t_ * cp_.degree();
  const std::vector<int32_t> positions = cp_.host_positions();
  for (int64_t j = 0; j < N; ++j)
    token_.push_back(j / t_ * T_ + (positions.empty() ? j % t_ : positions[size_t(j % t_)]));
  const int64_t Fe = expert_ffn_dim(cfg), p = ep_.etp_degree(), r = ep_.etp_rank();
  PENTAD_CHECK(E_ % ep_.ep_degree() == 0 && Fe % p == 0 && k_ <= E_,
               "MoE layer {}: {} experts, top {}, width {} over ep {} x etp {}", layer, E_, k_, Fe,
               ep_.ep_degree(), p);
  F_ = Fe / p;
  bound_ = moe_row_bound(double(rows_), double(b_ * T_), double(E_), double(k_),
                         double(ep_.ep_degree()), double(p), double(moe_.capacity_factor));
  ep_.reserve(bound_.received, C_, device_, act_);
  // The router, the expert bias and each local expert's parameters (model/param_table.h).
  const std::vector<ParamDecl> decls = layer_params(cfg, true);
  for (const ParamDecl& d : decls) {
    if (!d.routed || d.expert()) continue;
    const int id = add_param(params, d, layer_prefix(layer) + d.name, tp_);
    if (d.role == Role::Router) router_ = id;
    if (d.role == Role::ExpertBias) bias_ = id;
  }
  const int64_t first = ep_.first_expert(E_);
  for (int64_t e = first; e < first + ep_.local_experts(E_); ++e) {
    Expert x;
    for (const ParamDecl& d : decls) {
      if (!d.expert()) continue;
      const int id = add_param(params, d, expert_prefix(layer, e) + d.name, tp_, p, r);
      if (d.role == Role::GateW) x.gate = id;
      if (d.role == Role::UpW) x.up = id;
      if (d.role == Role::UpB) x.up_b = id;
      if (d.role == Role::DownW) x.down = id;
      if (d.role == Role::DownB) x.down_b = id;
    }
    experts_.push_back(x);
  }
  counts_.assign(static_cast<size_t>(E_), 0.0);
}

MoeRowBound moe_row_bound(double rows, double tokens, double experts, double top_k, double ep,
                          double etp, double capacity_factor) {
  const double senders = ep * etp, local = experts / ep;
  MoeRowBound b{rows * top_k, senders * rows * std::min(top_k, local)};
  if (capacity_factor > 0) {
    const double capacity = std::ceil(capacity_factor * tokens * top_k / experts);
    b.received = std::min(b.received, local * senders * std::min(rows, capacity));
  }
  return b;
}

void declare_moe_routing(double Nl, double E, double k, ActSink& sink, MoeBlock::Acts& a) {
  a.logits = sink.add("logits", {Nl, E}, DType::F32);
  a.scores = sink.add("scores", {Nl, E}, DType::F32);
  a.pick = sink.add("pick", {Nl, k}, DType::I32);
  a.w = sink.add("w", {Nl, k}, DType::F32);
  a.pos = sink.add("pos", {Nl, k}, DType::I32);
}

void declare_moe_rows(double A, double R, double C, double F, DType act, bool gpt2, ActSink& sink,
                      MoeBlock::Acts& a) {
  a.src = sink.add("src", {A}, DType::I32);
  a.xp = sink.add("xp", {A, C}, act);
  a.xr = sink.add("xr", {R, C}, act);
  if (!gpt2) a.gate = sink.add("gate", {R, F}, act);
  a.up = sink.add("up", {R, F}, act);
  a.act = sink.add("act", {R, F}, act);
  a.yr = sink.add("yr", {R, C}, act);
  a.yp = sink.add("yp", {A, C}, act);
}

void MoeBlock::size_routing(Acts& a) {
  if (a.routing.capacity() > 0) return;  // its sizes never change
  fit(a.routing, "moe routing", device_, [&](Arena& arena) {
    ArenaSink sink(arena);
    declare_moe_routing(double(rows_), double(E_), double(k_), sink, a);
  });
}

void MoeBlock::size_rows(Acts& a, int64_t A, int64_t R) {
  fit_rows(a.rows, "moe activations", A, R, [&](Arena& arena, double sent, double received) {
    ArenaSink sink(arena);
    declare_moe_rows(sent, received, double(C_), double(F_), act_, gpt2_, sink, a);
  });
}

Tensor MoeBlock::router_input(const Tensor& x) {
  if (act_ == DType::F32) return x;
  fit(shared_.router, "moe router (fp32)", device_, [&](Arena& arena) {
    x32_ = arena.alloc(Shape{rows_, C_});
    dx32_ = arena.alloc(Shape{rows_, C_});
    dx_act_ = arena.alloc(Shape{rows_, C_}, act_);
  });
  k::convert(x32_, x);
  return x32_;
}

// The router (model/router.h) in four steps: scores and picks of this rank's rows, the
// balancing losses over the micro-batch, the capacity drops, the permutation into expert
// order.
void MoeBlock::route(Acts& a, const Tensor& x, float weight, bool count) {
  size_routing(a);
  a.aux_coef.clear();
  a.seq_coef.clear();
  score(a, x);
  const bool losses = moe_.aux_loss_coef > 0 || moe_.seq_aux_loss_coef > 0 || moe_.z_loss_coef > 0;
  if (weight != 0.0f && losses) balance(a, count);
  std::vector<uint8_t> kept(static_cast<size_t>(rows_ * k_), 1);
  if (moe_.capacity_factor > 0) drop_over_capacity(a, kept);
  if (count && weight != 0.0f) {
    const int32_t* pick = on_host(a.pick, a.host_pick);
    for (int64_t i = 0; i < rows_ * k_; ++i) {
      counts_[size_t(pick[i])] += 1.0;
      if (!kept[size_t(i)]) dropped_ += 1.0;
    }
  }
  permute(a, kept);
}

void MoeBlock::score(Acts& a, const Tensor& x) {
  const int64_t Nl = rows_, E = E_, K = k_;
  // The router in fp32 from its master weight (router_input: x cast when in bf16).
  k::linear_forward(a.logits, router_input(x), params_.param(router_), Tensor{});
  // Logits (and the selection bias) in; scores, picks and weights out (host_side above).
  const float* logits = host_side(a.logits, a.host_logits, true);
  float* s = host_side(a.scores, a.host_scores, false);
  std::vector<float> host_bias;
  const float* bias = host_side(params_.param(bias_), host_bias, true);
  int32_t* pick = host_side(a.pick, a.host_pick, false);
  float* w = host_side(a.w, a.host_w, false);
  a.lse.assign(static_cast<size_t>(Nl), 0.0f);
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t i = 0; i < Nl; ++i)
    a.lse[size_t(i)] = router::score_and_pick(logits + i * E, bias, s + i * E, pick + i * K,
                                              w + i * K, order, K, moe_.score, moe_.renormalize);
}

// The losses' statistics over the whole micro-batch: counts and probability sums per expert
// (and per sequence), summed over the ranks that share the micro-batch.
void MoeBlock::balance(Acts& a, bool count) {
  std::vector<float> stats =
      router::balance_statistics(on_host(a.scores, a.host_scores), on_host(a.pick, a.host_pick),
                                 a.lse, rows_, E_, k_, b_, t_, row_start_, moe_.score);
  sum_over_micro_batch(stats);
  router::BalanceLosses losses = router::balance_losses(stats, moe_, E_, k_, b_, T_);
  a.aux_coef = std::move(losses.aux_coef);
  a.seq_coef = std::move(losses.seq_coef);
  if (count && tp_.rank() == 0 && cp_.rank() == 0) {  // once per micro-batch
    aux_ += losses.aux;
    seq_aux_ += losses.seq_aux;
    z_ += losses.z;
  }
}

// Capacity over the micro-batch: every rank sees every pick (a sum of zero-filled shares
// over the ranks sharing the micro-batch), decides the same drops, and keeps its own rows'.
void MoeBlock::drop_over_capacity(Acts& a, std::vector<uint8_t>& kept) const {
  const int64_t N = b_ * T_, K = k_, E = E_, Nl = rows_;
  std::vector<float> all(static_cast<size_t>(2 * N * K), 0.0f);  // [expert, score] per pick
  std::vector<int64_t> mine(static_cast<size_t>(N), -1);         // token -> row held here
  const int32_t* pick = on_host(a.pick, a.host_pick);
  const float* s = on_host(a.scores, a.host_scores);
  for (int64_t i = 0; i < Nl; ++i) {
    const int64_t token = token_[size_t(row_start_ + i)];
    mine[size_t(token)] = i;
    for (int64_t j = 0; j < K; ++j) {
      const size_t g = size_t(token * K + j);
      all[2 * g] = static_cast<float>(pick[i * K + j]);
      all[2 * g + 1] = s[i * E + pick[i * K + j]];
    }
  }
  sum_over_micro_batch(all);
  router::drop_over_capacity(all, mine, N, K, E, double(moe_.capacity_factor), kept);
}

// Expert order: the kept picks sorted by expert, then by row and pick; the hooks plan the
// dispatch from the counts, and the rows' buffers are sized for it.
void MoeBlock::permute(Acts& a, const std::vector<uint8_t>& kept) {
  const int64_t n = rows_ * k_;
  const int32_t* pick = on_host(a.pick, a.host_pick);
  const std::vector<int64_t> counts = router::count_by_expert(pick, kept, n, E_);
  ExpertRoute& route = a.route;
  route.send = counts;
  ep_.plan(route);
  a.picks = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  size_rows(a, a.picks, route.recv_rows);
  std::vector<int32_t> host_pos, host_src;
  int32_t* pos = host_side(a.pos, host_pos, false);
  int32_t* src = host_side(a.src, host_src, false);
  router::expert_order(pick, kept, n, k_, counts, pos, src);
  // What the permutation kernels read. (On CUDA the device logits, scores and pick are not
  // read again: the host copies in `a` serve drop_over_capacity and router_backward.)
  to_device(a.w, on_host(a.w, a.host_w));
  to_device(a.pos, pos);
  to_device(a.src, src);
}

void MoeBlock::sum_over_micro_batch(std::vector<float>& values) const {
  const Tensor t = view_of(values.data(), Shape{int64_t(values.size())});
  if (tp_.sequence_parallel()) tp_.sum(t);
  if (cp_.degree() > 1) cp_.sum(t);
}

void MoeBlock::forward(Acts& a, const Tensor& x, Tensor out, float weight, bool count) {
  route(a, x, weight, count);
  k::moe_permute(a.xp, x, a.src);
  ep_.dispatch(a.route, a.xp, a.xr);
  experts_forward(a);
  ep_.combine(a.route, a.yr, a.yp);
  k::moe_unpermute(out, a.yp, a.pos, a.w, false);
}

void MoeBlock::decode(const Tensor& x, Tensor out) {
  PENTAD_CHECK(x.device == device_ && x.dtype == act_ && ep_.ep_degree() == 1 &&
                   ep_.etp_degree() == 1 && tp_.degree() == 1,
               "MoE decode: one device holding every expert");
  const int64_t n = x.dim(0), E = E_, K = k_, A = n * K;
  // This call's buffers on the model's device: the router's fp32 input and logits, the
  // permutation and weights, and the experts' rows (as training's Acts).
  Acts a;
  Tensor x32, logits, src, pos, w;
  fit(decode_, "moe decode", device_, [&](Arena& arena) {
    if (act_ != DType::F32) x32 = arena.alloc(Shape{n, C_});
    logits = arena.alloc(Shape{n, E});
    src = arena.alloc(Shape{A}, DType::I32);
    pos = arena.alloc(Shape{n, K}, DType::I32);
    w = arena.alloc(Shape{n, K});
    a.xr = arena.alloc(Shape{A, C_}, act_);
    if (!gpt2_) a.gate = arena.alloc(Shape{A, F_}, act_);
    a.up = arena.alloc(Shape{A, F_}, act_);
    a.act = arena.alloc(Shape{A, F_}, act_);
    a.yr = arena.alloc(Shape{A, C_}, act_);
  });
  // Routing as training's, without a capacity (decoding is dropless) and without statistics:
  // the router in fp32 from its master weight, the picks on the host (host_side above).
  if (act_ != DType::F32) k::convert(x32, x);
  k::linear_forward(logits, act_ != DType::F32 ? x32 : x, params_.param(router_), Tensor{});
  std::vector<float> host_logits, host_bias, scores(static_cast<size_t>(n * E)), host_w;
  const float* lg = host_side(logits, host_logits, true);
  const float* bias = host_side(params_.param(bias_), host_bias, true);
  float* wt = host_side(w, host_w, false);
  std::vector<int32_t> pick(static_cast<size_t>(A)), host_pos, host_src;
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t i = 0; i < n; ++i)
    router::score_and_pick(lg + i * E, bias, scores.data() + i * E, pick.data() + i * K, wt + i * K,
                           order, K, moe_.score, moe_.renormalize);
  // Picks in expert order (as route(), every pick kept), then the training's own kernels:
  // permute, every expert's MLP over its rows, weighted sum back in pick order.
  const std::vector<uint8_t> kept(static_cast<size_t>(A), 1);
  a.route.rows = router::count_by_expert(pick.data(), kept, A, E);
  int32_t* ps = host_side(pos, host_pos, false);
  int32_t* sr = host_side(src, host_src, false);
  router::expert_order(pick.data(), kept, A, K, a.route.rows, ps, sr);
  to_device(w, wt);
  to_device(pos, ps);
  to_device(src, sr);
  k::moe_permute(a.xr, x, src);
  experts_forward(a);
  k::moe_unpermute(out, a.yr, pos, w, false);
}

void MoeBlock::experts_forward(Acts& a) {
  // Every local expert's GEMMs as one grouped GEMM per layer (the threads split the rows,
  // kernels/ops.h), the activations over all rows at once.
  const bool add_bias = ep_.etp_rank() == 0;  // a replicated bias, counted once in the etp sum
  const std::vector<int64_t>& rows = a.route.rows;
  auto weights = [&](int Expert::*id) {
    std::vector<Tensor> out;
    for (const Expert& x : experts_) out.push_back(W(x.*id));
    return out;
  };
  if (gpt2_) {
    const std::vector<Tensor> up_b = weights(&Expert::up_b);
    k::grouped_linear_forward(a.up, a.xr, rows, weights(&Expert::up), up_b);
    k::gelu_forward(a.act, a.up);
  } else {
    k::grouped_linear_forward(a.gate, a.xr, rows, weights(&Expert::gate), {});
    k::grouped_linear_forward(a.up, a.xr, rows, weights(&Expert::up), {});
    k::swiglu_forward(a.act, a.gate, a.up);
  }
  const std::vector<Tensor> down_b = add_bias ? weights(&Expert::down_b) : std::vector<Tensor>{};
  k::grouped_linear_forward(a.yr, a.act, rows, weights(&Expert::down), down_b);
}

void MoeBlock::backward(Acts& a, const Tensor& x, const Tensor& dout, Tensor dx, float weight) {
  const int64_t Nl = rows_;
  Tensor dyp, dw, dlogits, dyr, dxr, dxp, dact, dgate, dup;
  // Rows in the activations' type; dw and dlogits F32.
  auto plan = [&](Arena& arena, double sent, double received) {
    const auto A = int64_t(sent), R = int64_t(received);
    dyp = arena.alloc(Shape{A, C_}, act_);
    dw = arena.alloc(Shape{Nl, k_});
    dlogits = arena.alloc(Shape{Nl, E_});
    dyr = arena.alloc(Shape{R, C_}, act_);
    dxr = arena.alloc(Shape{R, C_}, act_);
    dxp = arena.alloc(Shape{A, C_}, act_);
    if (!gpt2_) dact = arena.alloc(Shape{R, F_}, act_), dgate = arena.alloc(Shape{R, F_}, act_);
    dup = arena.alloc(Shape{R, F_}, act_);
  };
  fit_rows(shared_.backward, "moe backward", a.picks, a.route.recv_rows, plan);
  k::moe_unpermute_backward(dyp, dw, dout, a.yp, a.pos, a.w);
  ep_.dispatch(a.route, dyp, dyr);
  experts_backward(a, dyr, dxr, dact, dgate, dup);
  ep_.combine(a.route, dxr, dxp);
  k::moe_unpermute(dx, dxp, a.pos, Tensor{}, true);
  router_backward(a, x, dw, dlogits, dx, weight);
}

void MoeBlock::experts_backward(Acts& a, const Tensor& dyr, Tensor dxr, Tensor dact, Tensor dgate,
                                Tensor dup) {
  // The grouped GEMMs of experts_forward, backwards (GPT-2's use d(up) alone).
  const std::vector<int64_t>& rows = a.route.rows;
  auto list = [&](int Expert::*id, bool grad) {
    std::vector<Tensor> out;
    for (const Expert& x : experts_) out.push_back(grad ? G(x.*id) : W(x.*id));
    return out;
  };
  if (gpt2_) {
    // Every etp rank holds the whole d(output), so each sums the replicated bias's gradient.
    k::grouped_linear_backward(dup, list(&Expert::down, true), list(&Expert::down_b, true), dyr,
                               a.act, rows, list(&Expert::down, false), false);
    k::gelu_backward(dup, dup, a.up);
    k::grouped_linear_backward(dxr, list(&Expert::up, true), list(&Expert::up_b, true), dup, a.xr,
                               rows, list(&Expert::up, false), false);
  } else {
    k::grouped_linear_backward(dact, list(&Expert::down, true), {}, dyr, a.act, rows,
                               list(&Expert::down, false), false);
    k::swiglu_backward(dgate, dup, dact, a.gate, a.up);
    k::grouped_linear_backward(dxr, list(&Expert::gate, true), {}, dgate, a.xr, rows,
                               list(&Expert::gate, false), false);
    k::grouped_linear_backward(dxr, list(&Expert::up, true), {}, dup, a.xr, rows,
                               list(&Expert::up, false), true);
  }
}

// d(logits), then the router's weight gradient and its share of d(x).
void MoeBlock::router_backward(Acts& a, const Tensor& x, const Tensor& dw, const Tensor& dlogits,
                               Tensor dx, float weight) {
  logits_backward(a, dw, dlogits, weight);
  router_gemm_backward(x, dlogits, dx, G(router_));
}

// d(logits) from the weights' gradients, the balancing losses and the z-loss (host logic).
void MoeBlock::logits_backward(const Acts& a, const Tensor& dw_t, const Tensor& dlogits_t,
                               float weight) {
  const int64_t Nl = rows_, E = E_, K = k_;
  const bool sigmoid = moe_.score == MoeScore::Sigmoid;
  const float* s = on_host(a.scores, a.host_scores);
  const float* l = on_host(a.logits, a.host_logits);
  const int32_t* pick = on_host(a.pick, a.host_pick);
  const float* w = on_host(a.w, a.host_w);
  std::vector<float> host_dw, host_dlogits;
  const float* dw = host_side(dw_t, host_dw, true);
  float* dlogits = host_side(dlogits_t, host_dlogits, false);  // every element set below
  const bool balance = !a.aux_coef.empty();
  std::vector<double> ds(static_cast<size_t>(E));
  for (int64_t i = 0; i < Nl; ++i) {
    const float* si = s + i * E;
    std::fill(ds.begin(), ds.end(), 0.0);
    // Weights: w_j = s_j / S (renormalised) or s_j.
    double picked = 0.0, wdw = 0.0;
    for (int64_t j = 0; j < K; ++j) {
      picked += si[pick[i * K + j]];
      wdw += double(w[i * K + j]) * dw[i * K + j];
    }
    for (int64_t j = 0; j < K; ++j) {
      const size_t e = size_t(pick[i * K + j]);
      ds[e] += moe_.renormalize ? (dw[i * K + j] - wdw) / picked : dw[i * K + j];
    }
    // Balancing losses: d/dp[t, e] is a constant per expert (and sequence); p = s, or s / sum s.
    if (balance) {
      const int64_t sq = (row_start_ + i) / t_;
      std::vector<double> dp(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e)
        dp[size_t(e)] = weight * (a.aux_coef[size_t(e)] + a.seq_coef[size_t(sq * E + e)]);
      if (sigmoid) {
        const double total = std::accumulate(si, si + E, 0.0);
        double pdp = 0.0;
        for (int64_t e = 0; e < E; ++e) pdp += si[e] / total * dp[size_t(e)];
        for (int64_t e = 0; e < E; ++e) ds[size_t(e)] += (dp[size_t(e)] - pdp) / total;
      } else {
        for (int64_t e = 0; e < E; ++e) ds[size_t(e)] += dp[size_t(e)];
      }
    }
    float* dl = dlogits + i * E;
    if (sigmoid) {
      for (int64_t e = 0; e < E; ++e) dl[e] = float(ds[size_t(e)] * si[e] * (1.0 - si[e]));
    } else {
      double sds = 0.0;
      for (int64_t e = 0; e < E; ++e) sds += si[e] * ds[size_t(e)];
      for (int64_t e = 0; e < E; ++e) dl[e] = float(si[e] * (ds[size_t(e)] - sds));
    }
    if (moe_.z_loss_coef > 0) {  // d/dl of coef / T * lse^2 = coef / T * 2 lse softmax(l)
      const double lse = a.lse[size_t(i)];
      const double c = weight * moe_.z_loss_coef / double(b_ * T_) * 2.0 * lse;
      for (int64_t e = 0; e < E; ++e) dl[e] += float(c * std::exp(double(l[i * E + e]) - lse));
    }
  }
  to_device(dlogits_t, dlogits);
}

void MoeBlock::router_gemm_backward(const Tensor& x, const Tensor& dlogits, Tensor dx,
                                    Tensor drouter) {
  if (act_ == DType::F32) {
    k::linear_backward(dx, drouter, Tensor{}, dlogits, x, params_.param(router_), true);
    return;
  }
  // In fp32 against the fp32 copy of x, then cast and added into d(x).
  const Tensor x32 = router_input(x);
  k::linear_backward(dx.data ? dx32_ : Tensor{}, drouter, Tensor{}, dlogits, x32,
                     params_.param(router_), false);
  if (!dx.data) return;
  k::convert(dx_act_, dx32_);
  k::add(dx, dx, dx_act_);
}

void MoeBlock::update_bias(const double* counts) {
  if (moe_.bias_update_rate <= 0) return;
  const double mean = std::accumulate(counts, counts + E_, 0.0) / double(E_);
  const Tensor bias_t = params_.param(bias_);
  std::vector<float> host_bias;
  float* bias = host_side(bias_t, host_bias, true);
  for (int64_t e = 0; e < E_; ++e) {
    const double gap = mean - counts[e];
    bias[e] += moe_.bias_update_rate * float((gap > 0) - (gap < 0));
  }
  to_device(bias_t, bias);
}

void MoeBlock::take_stats(std::vector<double>& counts, double& dropped, double& aux,
                          double& seq_aux, double& z) {
  counts.insert(counts.end(), counts_.begin(), counts_.end());
  dropped += dropped_;
  aux += aux_;
  seq_aux += seq_aux_;
  z += z_;
  std::fill(counts_.begin(), counts_.end(), 0.0);
  dropped_ = aux_ = seq_aux_ = z_ = 0.0;
}

}  // namespace pentad
