#pragma once
// The device mesh: every rank computation in pentad lives here.
//
// Dense layers see the world as pp × dp × cp × tp. `order` lists those four axes
// innermost first: with the default "tp,cp,dp,pp", tp ranks are adjacent (fastest links)
// and world_rank = tp + tp_degree * (cp + cp_degree * (dp + dp_degree * pp)).
//
// MoE layers see the same ranks as pp × edp × ep × etp (MoE Parallel Folding): within
// each pp stage, the stage's dp*cp*tp ranks, numbered by their dense coordinates in
// `order` with pp left out, are re-split with etp innermost:
//   stage_index = etp + etp_degree * (ep + ep_degree * edp),  edp = dp*cp*tp / (ep*etp).
// So EP may exceed DP, and ETP is chosen independently of TP.
#include <mpi.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "parallel/comm.h"

namespace pentad::parallel {

enum class Axis { TP, CP, DP, PP, EP, ETP, EDP };
constexpr int kNumAxes = 7;
const char* axis_name(Axis axis);  // "tp", "cp", ...

struct MeshConfig {
  int tp = 1, cp = 1, dp = 1, pp = 1, ep = 1, etp = 1;
  // Context parallelism: cp = cp_ulysses (inner, adjacent cp ranks) x ring degree (outer).
  int cp_ulysses = 1;
  std::string order = "tp,cp,dp,pp";  // innermost first: tp ranks are adjacent
  // 2D tensor parallelism (parallel/tp/tensor_parallel.h): the tp ranks as a tp/tp_d2 x
  // tp_d2 mesh. Row-first: tp rank t is (t / d2, t % d2), a mesh row of d2 adjacent ranks;
  // column-first: (t % d1, t / d1), a mesh column of d1 adjacent ranks.
  int tp_d2 = 1;
  bool tp_column_first = false;
  // The pipeline's chunks placed in a V (zb-v): the first stage holds the last chunk too,
  // so no other stage holds a copy of a tied embedding.
  bool pp_vee = false;
};

// A tp rank's place on the 2D tp mesh: heads index i (of d1), hidden index j (of d2).
struct TpPlace {
  int i = 0, j = 0;
  int logical(int d2) const { return i * d2 + j; }
};
TpPlace tp_place(const MeshConfig& config, int tp_rank);

// Throws pentad::Error naming the degree to change if `config` cannot run on
// `world_size` ranks: a degree below 1, an order that is not a permutation of
// tp,cp,dp,pp, a product that is not world_size, or ep*etp not dividing dp*cp*tp.
void validate(const MeshConfig& config, int world_size);

// Throws pentad::Error naming the degree or model key to change if the model cannot be
// split this way: tp must divide the vocab (and, with sequence parallelism,
// micro_batch*seq_len); tp's d1 (all of tp in 1D) heads, kv heads and ffn width; a 2D
// shape's d2 the model width; cp must divide seq_len; pp <= n_layer. The one statement of
// these rules: the layout, `tp_shape = "auto"` and the planner all ask it.
void check_layout(const MeshConfig& config, int64_t d_model, int64_t n_head, int64_t n_kv_head,
                  int64_t vocab_size, int64_t ffn_dim, int64_t n_layer, int64_t seq_len,
                  int64_t micro_batch, bool sequence_parallel);

// A rank's coordinate on every axis, dense and expert, indexed by Axis.
using MeshCoords = std::array<int, kNumAxes>;

// The pure rank arithmetic (no MPI): usable by planners, checkpoint tools and tests.
// `config` must be valid for the world size.
MeshCoords mesh_coords(const MeshConfig& config, int world_rank);
int mesh_degree(const MeshConfig& config, Axis axis);                     // EDP included
int mesh_rank(const MeshConfig& config, int tp, int cp, int dp, int pp);  // inverse, dense

class Mesh {
 public:
  // Collective over `world`: validates, then builds every group with MPI_Comm_split, in
  // the same order on every rank (an NCCL group's creation blocks until all its ranks join).
  // With Backend::NCCL every group also takes host tensors (parallel/comm.h), so scalars
  // such as loss sums and flags use the same groups as device tensors.
  static Mesh create(const MeshConfig& config, MPI_Comm world, Backend backend = Backend::MPI);

  Mesh(Mesh&&) noexcept;
  Mesh& operator=(Mesh&&) noexcept;
  ~Mesh();

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int degree(Axis axis) const { return mesh_degree(config_, axis); }
  int coord(Axis axis) const { return coords_[size_t(axis)]; }
  const MeshConfig& config() const { return config_; }

  // The ranks that differ from this one only along `axis`; group rank = coord(axis).
  Communicator& group(Axis axis);
  // Gradient reduction of dense parameters: ranks sharing the tp and pp coordinates.
  Communicator& dp_cp();
  Communicator& world();
  // MoE experts: the ranks of this one's pp stage and edp coordinate (ep x etp of them),
  // which together hold every expert once.
  Communicator& expert_model();
  // Context parallelism's Ulysses and ring groups within the cp group (rank c has Ulysses
  // rank c % cp_ulysses and ring rank c / cp_ulysses); null where the degree is 1.
  Communicator* cp_ulysses();
  Communicator* cp_ring();
  // The first and last pipeline stages of this rank's (tp, cp, dp) coordinates, which both
  // hold the tied embedding; null on other stages and without pipelining.
  Communicator* embedding_group();

  // 2D tensor parallelism (config().tp_d2 > 1): every tp rank in logical order, the d1
  // ranks sharing this one's hidden index j, the d2 ranks sharing its heads index i; null
  // otherwise.
  Communicator* tp_all();
  Communicator* tp_heads();
  Communicator* tp_hidden();

  // "rank 5: pp 0/1 dp 1/2 cp 0/1 tp 1/2 | ep 0/1 etp 1/2 edp 1/2" (dense axes
  // outermost first, as the order puts them).
  std::string describe() const;

 private:
  Mesh() = default;
  MeshConfig config_;
  int world_rank_ = 0;
  int world_size_ = 1;
  MeshCoords coords_{};
  std::array<std::unique_ptr<Communicator>, kNumAxes> groups_;
  std::unique_ptr<Communicator> dp_cp_;
  std::unique_ptr<Communicator> embedding_;
  std::unique_ptr<Communicator> expert_model_;
  std::unique_ptr<Communicator> cp_ulysses_, cp_ring_;           // hybrid only
  std::unique_ptr<Communicator> tp_all_, tp_heads_, tp_hidden_;  // 2D tp only
  std::unique_ptr<Communicator> world_;
};

}  // namespace pentad::parallel
