// Tensor parallelism's collectives per layer and the choice of its shape (1D or d1 x d2;
// plan/cost_model.h).
#include <limits>
#include <string>
#include <vector>

#include "core/check.h"
#include "model/param_table.h"
#include "plan/cost_model.h"
#include "plan/cost_parts.h"
#include "plan/layout.h"

namespace pentad {

using cost::element_bytes;
using cost::group_of;
using cost::tp2d_group;
using parallel::CollectiveOp;

std::vector<CollectiveCall> tp_layer_collectives(const Config& cfg,
                                                 const parallel::MeshConfig& mesh, bool backward) {
  std::vector<CollectiveCall> calls;
  if (mesh.tp == 1) return calls;
  const ModelConfig& m = cfg.model;
  const bool sp = cfg.parallel.sequence_parallel;
  const double n = double(cfg.train.micro_batch * cfg.train.seq_len) / mesh.cp;
  const double C = double(m.d_model), e = element_bytes(cfg);
  const double qkv = C + 2.0 * double(m.kv_heads() * m.head_dim());
  const double F = double(ffn_dim(m)), up = m.family == ModelFamily::GPT2 ? F : 2 * F;
  const std::vector<int> all = group_of(mesh, parallel::Axis::TP);
  if (mesh.tp_d2 == 1) {  // Megatron: g after o and after down (forward), f's mirror backward
    for (const char* what : {"attention", "mlp"}) {
      if (sp) {
        calls.push_back(
            {CollectiveOp::AllGather, all, n * C * e, 0, std::string(what) + " gather"});
        calls.push_back(
            {CollectiveOp::ReduceScatter, all, n * C * e, 0, std::string(what) + " scatter"});
      } else {
        calls.push_back({CollectiveOp::AllReduce, all, n * C * e, 0, what});
      }
    }
    return calls;
  }
  const double d2 = mesh.tp_d2, d1 = mesh.tp / mesh.tp_d2;
  const double hidden = double(cfg.parallel.tp_chunks - 1) / double(cfg.parallel.tp_chunks);
  const std::vector<int> g1 = tp2d_group(mesh, true), g2 = tp2d_group(mesh, false);
  // A row-parallel GEMM's output (forward) or a column-parallel one's input gradient
  // (backward): partial sums over d1 of n x C/d2, then the whole rows over d2.
  auto finish_rows = [&](const std::string& what) {
    if (sp) {
      calls.push_back({CollectiveOp::ReduceScatter, g1, n * C / d2 * e, hidden, what + " d1"});
      calls.push_back({CollectiveOp::AllToAll, g2, n * C / (d1 * d2) * e, hidden, what + " d2"});
    } else {
      calls.push_back({CollectiveOp::AllReduce, g1, n * C / d2 * e, hidden, what + " d1"});
      calls.push_back({CollectiveOp::AllGather, g2, n * C * e, hidden, what + " d2"});
    }
  };
  // A column-parallel GEMM's output (forward; its input is split over d2) or a row-parallel
  // one's input gradient (backward): an all-reduce over d2 of n x width/d1.
  auto over_d2 = [&](double width, const std::string& what) {
    calls.push_back({CollectiveOp::AllReduce, g2, n * width / d1 * e, hidden, what + " d2"});
  };
  // With SP, columns j of the whole rows from this rank's sequence shard (gather_hidden:
  // before q/k/v and up forward, before o's and down's input gradient backward): an
  // all-to-all over d2 of this rank's rows, then an all-gather over d1 to n x C/d2.
  if (sp)
    for (const char* what : {"attention entry", "mlp entry"}) {
      calls.push_back(
          {CollectiveOp::AllToAll, g2, n * C / (d1 * d2) * e, 0, std::string(what) + " d2"});
      calls.push_back({CollectiveOp::AllGather, g1, n * C / d2 * e, 0, std::string(what) + " d1"});
    }
  if (!backward) {
    over_d2(qkv, "qkv");
    finish_rows("o");
    over_d2(up, "up");
    finish_rows("down");
  } else {
    over_d2(F, "down grad");
    finish_rows("up grad");
    over_d2(C, "o grad");
    finish_rows("qkv grad");
  }
  return calls;
}

std::string TpShapeChoice::describe(int tp) const {
  return fmt::format("{}x{}{}", tp / d2, d2,
                     d2 > 1 && d2 < tp ? (column_first ? " column" : " row") : "");
}

TpShapeChoice choose_tp_shape(const Config& cfg, parallel::MeshConfig mesh,
                              const parallel::Topology& measured) {
  const ModelConfig& m = cfg.model;
  // (The shape moves no rank between dense coordinates: one fold serves every shape.)
  const parallel::Topology folded =
      measured.slowed.empty() ? parallel::Topology{} : cost::fold_slow_links(measured, mesh);
  const parallel::Topology& topology = measured.slowed.empty() ? measured : folded;
  auto seconds = [&](const parallel::MeshConfig& shape) {
    double total = 0;
    for (bool backward : {false, true})
      for (const CollectiveCall& c : tp_layer_collectives(cfg, shape, backward))
        total += topology.collective_seconds(c.op, c.group, c.bytes) * (1.0 - c.hidden);
    return total;
  };
  // Why the layout would refuse a shape ("" if it would not): the mesh's rules, stated once.
  auto refusal = [&](const parallel::MeshConfig& shape) -> std::string {
    try {
      parallel::check_layout(shape, m.d_model, m.n_head, m.n_kv_head, m.vocab_size, ffn_dim(m),
                             m.n_layer, cfg.train.seq_len, cfg.train.micro_batch,
                             cfg.parallel.sequence_parallel);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  TpShapeChoice best;
  mesh.tp_d2 = 1;
  mesh.tp_column_first = false;
  best.one_d_seconds = seconds(mesh);
  const std::string one_d = refusal(mesh);
  best.seconds = one_d.empty() ? best.one_d_seconds : std::numeric_limits<double>::infinity();
  best.candidates = one_d.empty() ? fmt::format("{}x1 {:.3g} ms", mesh.tp, best.seconds * 1e3)
                                  : fmt::format("{}x1 does not split the model", mesh.tp);
  std::string two_d;  // each 2D shape's refusal
  for (int d2 = 2; d2 <= mesh.tp; ++d2) {
    if (mesh.tp % d2 != 0) continue;
    mesh.tp_d2 = d2;
    if (const std::string why = refusal(mesh); !why.empty()) {
      two_d += fmt::format("{}{}x{}: {}", two_d.empty() ? "" : "; ", mesh.tp / d2, d2, why);
      continue;
    }
    for (bool column : {false, true}) {
      if (column && d2 == mesh.tp) continue;  // one order only
      mesh.tp_column_first = column;
      const double s = seconds(mesh);
      TpShapeChoice shape;
      shape.d2 = d2;
      shape.column_first = column;
      best.candidates += fmt::format(", {} {:.3g} ms", shape.describe(mesh.tp), s * 1e3);
      if (s < best.seconds) {
        best.seconds = s;
        best.d2 = d2;
        best.column_first = column;
      }
    }
  }
  if (best.seconds == std::numeric_limits<double>::infinity())
    fail(
        "parallel.tp_shape = \"auto\" finds no shape of parallel.tp = {} that splits this model. "
        "1D ({}x1) splits the heads, kv heads and MLP width over all of tp: {}. 2D (d1 x d2) "
        "splits them over d1 and model.d_model over d2: {}. Change parallel.tp, or the model's "
        "sizes",
        mesh.tp, mesh.tp, one_d, two_d.empty() ? "tp has no 2D shape" : two_d);
  return best;
}

}  // namespace pentad
