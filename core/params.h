#pragma once
// The parameter table. Every parameter knows its global identity (name, global shape)
// and which slice of it this rank holds, so checkpoints, ZeRO and resharding never
// depend on the layout that wrote them. Parameters, gradients and optimizer moments
// each live in one arena with identical offsets: an optimizer or a gradient bucket can
// treat any of them as one flat buffer.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace pentad {

enum class Init { Normal, Ones, Zeros };

// Where a model's memory lives and the element type it computes in. Master parameters,
// their gradients and the optimizer state are always F32; with compute = BF16 (CUDA only)
// the forward and backward read a BF16 copy of the parameters (kernels::refresh_weights() after
// each optimizer step) and keep activations in BF16.
struct Placement {
  Device device = Device::CPU;
  DType compute = DType::F32;
  // ZeRO over more than one rank (parallel/dp/grad_reducer.h): the arenas are reserved
  // (Arena::reserved) instead of backed. sparse_grads (stages 2, 3): the gradient arena holds
  // no memory; each bucket's gradients live in a buffer of their own from the first write of
  // backward to the end of their reduction. sparse_params (stage 3): only the ranges given to
  // commit_params() (this rank's shares) are backed; the model reads a unit's parameters from
  // the buffer its all-gather filled. Either way the model's accessors (param, grad, weight)
  // resolve through the homes place_*() set, and fail, naming the parameter, without one.
  bool sparse_params = false;
  bool sparse_grads = false;
};

struct ParamSpec {
  std::string name;    // global identity, e.g. "layers.3.attn.q.weight" (HF-like)
  Shape global_shape;  // shape of the whole parameter across all ranks
  Init init = Init::Normal;
  float init_std = 0.0f;
  bool weight_decay = false;  // matrices and embeddings decay; norms and biases do not

  // The slice this rank holds: [shard_start, shard_start + local_shape[shard_dim]) along
  // shard_dim, whole along other dims. shard_dim = -1: replicated (one rank: always).
  int shard_dim = -1;
  int64_t shard_start = 0;
  // 2D tensor parallelism cuts a matrix along both dims: the second cut, [shard_start2,
  // shard_start2 + local_shape[shard_dim2]) along shard_dim2 (-1: none).
  int shard_dim2 = -1;
  int64_t shard_start2 = 0;
  Shape local_shape;
  // Of the tp ranks holding this same slice (a 2D cut along one mesh dimension only: the
  // other dimension's ranks hold copies), this rank's index; copy 0 saves it and counts it
  // in the gradient norm.
  int tp_replica = 0;

  size_t offset = 0;  // element offset in each arena

  // A copy of a parameter another pipeline stage holds (the tied embedding on the last
  // stage): kept equal by summing both gradients, so it is not saved, dumped or counted
  // in the gradient norm here.
  bool pipeline_copy = false;

  // An MoE expert's parameter (src/model/moe.h): held by the ranks of its expert-parallel
  // coordinate, so its gradient is summed over the mesh's edp group, not dp x cp.
  bool expert = false;
};

// The part of the parameter arena whose optimizer state (and reduced gradients) one rank
// keeps: with ZeRO, each data-parallel rank owns a share of every gradient bucket, cut at
// row boundaries of the parameters (dim 0 of their local shape), and keeps that share's
// state in a compact buffer. Without ZeRO, one range: the whole arena at its own offsets.
struct StateShard {
  struct Range {
    int64_t begin = 0, end = 0;  // element offsets in the parameter arena
    int64_t shard = 0;           // where begin sits in the compact buffer
  };
  // Part of one parameter: rows [row_start, row_start + rows) of its local shape.
  struct Piece {
    int64_t arena = 0, shard = 0, count = 0;  // element offsets and length
    int64_t row_start = 0, rows = 0;
  };
  std::vector<Range> ranges;  // ascending and disjoint
  int64_t numel = 0;          // elements of the compact buffer

  static StateShard whole(int64_t numel) { return {{{0, numel, 0}}, numel}; }
  bool is_whole(int64_t arena_numel) const {
    return ranges.size() == 1 && ranges[0].begin == 0 && ranges[0].end == arena_numel;
  }
  // This rank's pieces of a parameter, in arena order (none when it owns no row of it).
  std::vector<Piece> pieces(const ParamSpec& spec) const;
  // One shard of both a's and b's parts of the arena (disjoint: two reducers' parameters,
  // dense and MoE experts), whose compact buffer holds a's buffer and then b's.
  static StateShard merge(const StateShard& a, const StateShard& b);
};

class ParamStore {
 public:
  // Parameters of at least this many elements start on a 4 KiB page in every arena.
  static constexpr int64_t kPageAlignedElements = int64_t{1} << 16;
  // Adds a parameter held whole on this rank; returns its id.
  int add(std::string name, Shape shape, Init init, float init_std, bool weight_decay);
  // Adds a parameter of global shape `shape` of which this rank holds
  // [shard_start, shard_start + shard_len) along shard_dim.
  int add_shard(std::string name, Shape shape, Init init, float init_std, bool weight_decay,
                int shard_dim, int64_t shard_start, int64_t shard_len);
  // A block of a matrix cut along both dims (2D tensor parallelism): [start0, start0 + len0)
  // rows and [start1, start1 + len1) columns; tp_replica as in ParamSpec.
  int add_block(std::string name, Shape shape, Init init, float init_std, bool weight_decay,
                int64_t start0, int64_t len0, int64_t start1, int64_t len1);
  void mark_pipeline_copy(int id) { specs_.at(static_cast<size_t>(id)).pipeline_copy = true; }
  void mark_expert(int id) { specs_.at(static_cast<size_t>(id)).expert = true; }
  void set_tp_replica(int id, int replica) {
    specs_.at(static_cast<size_t>(id)).tp_replica = replica;
  }
  // Allocates params, grads and, when the placement computes in another type than F32,
  // the compute copy (and nothing else: the optimizer owns its state), on its device.
  void allocate(Placement placement = {});
  // Fills every parameter from the seed: element i of parameter "name" is a function of
  // (seed, name, global index i) only, so any slice of any layout draws the same values.
  // Device parameters are drawn on the host and copied, so they are the CPU's bits.
  void initialize(uint64_t seed);
  // Parameter `spec`'s initial values, as initialize() draws them, into host memory at p.
  static void draw(const ParamSpec& spec, uint64_t seed, float* p);
  // The compute copy as one flat tensor (empty when the model computes in F32).
  // kernels::refresh_weights() re-derives it from the master parameters after every
  // change to them (initialize, optimizer step, load).
  Tensor compute_copy() const;

  // A second set of master parameters, laid out like the first (allocated and written
  // here, so that nothing pays for it later): an optimizer step can write into it while a
  // checkpoint still reads the live set, and swap_params() then makes it the live one.
  void allocate_spare();
  bool has_spare() const { return spare_.base() != nullptr; }
  Tensor spare_params() const;  // flat, like all_params()
  void swap_params();           // the spare set becomes the live one and the other way round

  Tensor param(int id) const;  // F32 master
  Tensor grad(int id) const;
  // What forward and backward read: the compute copy, or the master when that is F32.
  Tensor weight(int id) const;
  // Parameter id's view inside any F32 buffer laid out like the parameter arena (optimizer
  // moments, checkpoint staging, ...) on `device`.
  Tensor view(void* base, int id, Device device = Device::CPU) const;
  Tensor all_params() const;  // flat (numel) views over the whole arena
  Tensor all_grads() const;
  void zero_grads();
  // Parameter id's master values copied to host memory (for dumps and tests).
  std::vector<float> to_host(int id) const;

  // Sparse arenas (Placement::sparse_*). commit_params() backs parameter elements
  // [begin, end) in the arena and in the spare set (allocate() and allocate_spare() back
  // none); initialize() writes only what is backed.
  bool sparse_params() const { return placement_.sparse_params; }
  bool sparse_grads() const { return placement_.sparse_grads; }
  void commit_params(int64_t begin, int64_t end);
  size_t committed_param_bytes() const { return params_.committed_bytes(); }
  // Homes: the parameters starting in arena elements [begin, end) are read from `at` (element
  // `begin` there), their compute copy from `weights` (bf16 models), their gradients from
  // `grads`, until unplaced. A sparse store's gradient without a home asks the sources added
  // here, in order, to place one (the reducer owning it, at the first write of backward).
  void place_params(int64_t begin, int64_t end, float* at, void* weights);
  bool placed(int id) const { return !param_at_.empty() && param_at_[size_t(id)]; }
  void unplace_params(int64_t begin, int64_t end);
  void place_grads(int64_t begin, int64_t end, float* at);
  void unplace_grads(int64_t begin, int64_t end);
  using GradSource = std::function<bool(int id)>;
  void add_grad_source(GradSource source) { grad_sources_.push_back(std::move(source)); }

  Device device() const { return placement_.device; }
  DType compute_dtype() const { return placement_.compute; }
  size_t compute_copy_bytes() const { return weights_.capacity(); }  // 0 when F32

  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec& spec(int id) const { return specs_[static_cast<size_t>(id)]; }
  int find(const std::string& name) const;  // -1 when absent
  int64_t numel() const { return numel_; }  // local elements
  size_t bytes() const { return static_cast<size_t>(numel_) * sizeof(float); }

 private:
  std::vector<ParamSpec> specs_;
  int64_t numel_ = 0;
  Placement placement_;
  Arena params_, grads_;
  Arena spare_;    // the second set of master parameters, when allocate_spare() made it
  Arena weights_;  // the compute copy (same element offsets), when compute is not F32
  // Homes per parameter id (nullptr: the arena's own place).
  std::vector<float*> param_at_, grad_at_;
  std::vector<void*> weight_at_;
  std::vector<GradSource> grad_sources_;
  std::vector<std::pair<int64_t, int64_t>> committed_;  // commit_params()' ranges
  [[noreturn]] void homeless(int id, const char* what) const;
  template <typename T>
  void set_homes(std::vector<T*>& homes, int64_t begin, int64_t end, T* at, size_t element);
};

}  // namespace pentad
