// The activation table (model/activations.h): the sizes of one rank, the sinks, and each
// set's buffers in the order the model lays them out.
#include "model/activations.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "model/param_table.h"

namespace pentad {

ActSizes activation_sizes(const ModelConfig& cfg, double micro_batch, double seq_len,
                          double tp_degree, double tp_d2, bool sequence_parallel, DType act) {
  const double d1 = tp_degree / tp_d2;
  ActSizes s;
  s.b = micro_batch, s.t = seq_len;
  s.N = s.b * s.t, s.Nl = sequence_parallel ? s.N / tp_degree : s.N;
  s.C = double(cfg.d_model), s.Cj = s.C / tp_d2;
  s.H = double(cfg.n_head) / d1, s.Ca = s.H * double(cfg.head_dim());
  s.Ckv = double(cfg.kv_heads()) * double(cfg.head_dim()) / d1;
  s.F = double(ffn_dim(cfg)) / d1;
  s.Fs = cfg.is_moe() ? double(mlp_width(cfg, true)) / d1 : 0;
  s.V = double(cfg.vocab_size) / tp_degree;
  s.act = act;
  s.gpt2 = cfg.family == ModelFamily::GPT2;
  s.recompute = cfg.recompute.on;
  s.moe = cfg.is_moe();
  s.vocab_parallel = tp_degree > 1;
  s.sp = sequence_parallel;
  s.hidden_split = tp_d2 > 1;
  s.apart = sequence_parallel || tp_d2 > 1;
  return s;
}

Tensor ActSink::add(const char* name, std::initializer_list<double> shape, DType dtype) {
  double numel = 1;
  for (double d : shape) numel *= d;
  bytes += numel * double(dtype_bytes(dtype));
  ++buffers;
  return make(name, shape, dtype);
}

Tensor ActSink::make(const char*, std::initializer_list<double>, DType) {
  return {};
}

Tensor ArenaSink::make(const char* name, std::initializer_list<double> shape, DType dtype) {
  Shape dims;
  for (double d : shape) {
    PENTAD_CHECK(d >= 0 && d == std::floor(d), "activation {}: size {} is not whole", name, d);
    dims.dims[size_t(dims.ndim++)] = int64_t(d);
  }
  return arena_.alloc(dims, dtype);
}

Tensor ActListing::make(const char* name, std::initializer_list<double> shape, DType dtype) {
  rows.push_back({name, std::vector<double>(shape), dtype});
  return {};
}

void declare_layer(const ActSizes& s, double F, bool moe, ActSink& sink, LayerActs& a) {
  const DType act = s.act, f32 = DType::F32;
  a.norm1 = sink.add("norm1", {s.N, s.Cj}, act);
  if (s.gpt2) a.norm1_mean = sink.add("norm1_mean", {s.Nl}, f32);
  a.norm1_rstd = sink.add("norm1_rstd", {s.Nl}, f32);
  a.q = sink.add("q", {s.N, s.Ca}, act);
  a.k = sink.add("k", {s.N, s.Ckv}, act);
  a.v = sink.add("v", {s.N, s.Ckv}, act);
  a.att = sink.add("att", {s.N, s.Ca}, act);
  a.lse = sink.add("lse", {s.b, s.H, s.t}, f32);
  a.res1 = sink.add("res1", {s.Nl, s.C}, act);
  a.norm2 = sink.add("norm2", {s.N, s.Cj}, act);
  if (moe && s.hidden_split) a.norm2_rows = sink.add("norm2_rows", {s.Nl, s.C}, act);
  if (s.gpt2) a.norm2_mean = sink.add("norm2_mean", {s.Nl}, f32);
  a.norm2_rstd = sink.add("norm2_rstd", {s.Nl}, f32);
  if (F == 0) return;  // an MoE layer without shared experts
  a.up = sink.add("up", {s.N, F}, act);
  if (!s.gpt2) a.gate = sink.add("gate", {s.N, F}, act);
  a.act = sink.add("act", {s.N, F}, act);
}

// W's operands under recompute: declare_layer's buffers that W reads, in its order.
static void declare_w_inputs(const ActSizes& s, double F, bool moe, ActSink& sink, LayerActs& a) {
  const DType act = s.act;
  a.norm1 = sink.add("w_norm1", {s.N, s.Cj}, act);
  a.q = sink.add("w_q", {s.N, s.Ca}, act);
  a.k = sink.add("w_k", {s.N, s.Ckv}, act);
  a.v = sink.add("w_v", {s.N, s.Ckv}, act);
  a.att = sink.add("w_att", {s.N, s.Ca}, act);
  a.norm2 = sink.add("w_norm2", {s.N, s.Cj}, act);
  if (moe && s.hidden_split) a.norm2_rows = sink.add("w_norm2_rows", {s.Nl, s.C}, act);
  if (F == 0) return;  // an MoE layer without shared experts
  a.up = sink.add("w_up", {s.N, F}, act);
  if (!s.gpt2) a.gate = sink.add("w_gate", {s.N, F}, act);
  a.act = sink.add("w_act", {s.N, F}, act);
}

// A kept gradient (rows, cols): a view of `over`, an activation (Nl, C) of the slot that only
// B reads, when `in_place` (absent where `over` is: the memory plan's); else declared.
static Tensor kept_gradient(const ActSizes& s, const char* name, double rows, double cols,
                            bool in_place, const Tensor& over, ActSink& sink) {
  if (!in_place) return sink.add(name, {rows, cols}, s.act);
  PENTAD_CHECK(rows * cols <= s.Nl * s.C, "{}: ({}, {}) over ({}, {})", name, rows, cols, s.Nl,
               s.C);
  return over.data ? over.prefix(Shape{int64_t(rows), int64_t(cols)}) : Tensor{};
}

void declare_deferred_layer(const ActSizes& s, double F, bool moe, const Tensor& res1,
                            const Tensor& out, ActSink& sink, DeferredGrads& d) {
  // Under sequence parallelism this rank's rows (W gathers them), else whole rows.
  const double rows = s.sp ? s.Nl : s.N, cols = s.sp ? s.C : s.Cj;
  d.d_att_out = kept_gradient(s, "w_d_att_out", rows, cols, !s.recompute, res1, sink);
  if (F > 0)  // MoE: the block keeps its own
    d.d_out = kept_gradient(s, "w_d_out", rows, cols, true, out, sink);
  if (s.recompute) declare_w_inputs(s, F, moe, sink, d.inputs);
}

void declare_deferred_ends(const ActSizes& s, bool first, const Tensor& input, ActSink& sink,
                           Tensor& d_input) {
  if (first) d_input = kept_gradient(s, "w_d_input", s.Nl, s.C, true, input, sink);
}

void declare_batch(const ActSizes& s, ActSink& sink, SlotActs& slot) {
  slot.tokens = sink.add("tokens", {s.b, s.t}, DType::I32);
  slot.targets = sink.add("targets", {s.b, s.t}, DType::I32);
}

Tensor declare_residual(const ActSizes& s, ActSink& sink) {
  return sink.add("resid", {s.Nl, s.C}, s.act);
}

namespace {

// One of the head's buffers (ScratchActs): where it goes, its shape and type.
struct HeadBuffer {
  Tensor ScratchActs::*at;
  Shape shape;
  DType dtype;
};

// The final norm's output whole and this rank's rows (under SP only), the norm's statistics,
// the logits, the losses; a buffer of no elements is absent.
std::vector<HeadBuffer> head_buffers(const ActSizes& s) {
  const DType act = s.act, f32 = DType::F32;
  const auto n = [](double x) { return int64_t(x); };
  return {{&ScratchActs::normf, Shape{n(s.N), n(s.C)}, act},
          {&ScratchActs::normf_local, Shape{n(s.sp ? s.Nl : 0), n(s.C)}, act},
          {&ScratchActs::normf_mean, Shape{n(s.gpt2 ? s.Nl : 0)}, f32},
          {&ScratchActs::normf_rstd, Shape{n(s.Nl)}, f32},
          {&ScratchActs::logits, Shape{n(s.N), n(s.V)}, act},
          {&ScratchActs::losses, Shape{n(s.N)}, f32}};
}

size_t aligned_bytes(const HeadBuffer& b) {
  return Arena::aligned(size_t(b.shape.numel()) * dtype_bytes(b.dtype));
}

// The backward's layer gradients d_att .. d_act, which no forward touches: the head's
// buffers lie over them.
void declare_layer_grads(const ActSizes& s, double F, ActSink& sink, LayerGrads& g) {
  const DType act = s.act;
  g.att = sink.add("d_att", {s.N, s.Ca}, act);
  g.q = sink.add("d_q", {s.N, s.Ca}, act);
  g.k = sink.add("d_k", {s.N, s.Ckv}, act);
  g.v = sink.add("d_v", {s.N, s.Ckv}, act);
  if (F == 0) return;
  g.up = sink.add("d_up", {s.N, F}, act);
  if (!s.gpt2) g.gate = sink.add("d_gate", {s.N, F}, act);
  g.act = sink.add("d_act", {s.N, F}, act);
}

// The head's buffers laid out from `start` (absent where it is: a sink that allocates
// nothing), each aligned as an arena aligns, within `room` bytes.
void place_head(const ActSizes& s, const Tensor& start, size_t room, ScratchActs& h) {
  size_t used = 0;
  for (const HeadBuffer& b : head_buffers(s)) {
    if (!start.data || b.shape.numel() == 0) continue;
    h.*b.at = view_of(static_cast<char*>(start.data) + used, b.shape, b.dtype, start.device);
    used += aligned_bytes(b);
  }
  PENTAD_CHECK(used <= room, "the head's buffers: {} bytes in a region of {}", used, room);
  if (!s.sp) h.normf_local = h.normf;
}

}  // namespace

double head_scratch_extra_bytes(const ActSizes& s, double widest_ffn) {
  double head = 0;
  for (const HeadBuffer& b : head_buffers(s)) head += double(aligned_bytes(b));
  LayerGrads g;
  return std::max(
      0.0, head - bytes_of([&](ActSink& sink) { declare_layer_grads(s, widest_ffn, sink, g); }));
}

void declare_scratch(const ActSizes& s, double F, bool holds_last, ActSink& sink,
                     ScratchActs& scratch) {
  const DType act = s.act, f32 = DType::F32;
  // Under recompute, one layer's activations (2D's MoE layers: their routed rows too).
  if (s.recompute) declare_layer(s, F, s.moe, sink, scratch.layer);
  if (s.moe) scratch.moe_out = sink.add("moe_out", {s.Nl, s.C}, act);
  if (s.apart) scratch.norm_local = sink.add("norm_local", {s.Nl, s.C}, act);
  scratch.proj = sink.add("proj", {s.N, s.C}, act);
  if (s.vocab_parallel && holds_last) {
    scratch.row_max = sink.add("row_max", {s.N}, f32);
    scratch.ce_stats = sink.add("ce_stats", {2, s.N}, f32);
  }
  LayerGrads& g = scratch.grads;
  g.resid = sink.add("d_resid", {s.Nl, s.C}, act);
  g.full = s.apart ? sink.add("d_full", {s.N, s.C}, act) : g.resid;
  g.norm = sink.add("d_norm", {s.N, s.C}, act);
  g.norm_local = s.apart ? sink.add("d_norm_local", {s.Nl, s.C}, act) : g.norm;
  // From here on one region: the layer gradients and, holding the head, its buffers, which
  // only the last chunk's forward uses (its backward there writes g.resid and g.norm).
  declare_layer_grads(s, F, sink, g);
  if (!holds_last) return;
  Tensor end = F > 0 ? g.act : g.v;
  if (const double extra = head_scratch_extra_bytes(s, F); extra > 0)
    end = sink.add("head_beyond_d_act", {std::ceil(extra / 4)}, f32);
  const size_t room =
      end.data ? size_t(static_cast<char*>(end.data) + end.bytes() - static_cast<char*>(g.att.data))
               : 0;
  place_head(s, g.att, room, scratch);
}

}  // namespace pentad
