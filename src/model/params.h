#pragma once
// The parameter table. Every parameter knows its global identity (name, global shape)
// and which slice of it this rank holds, so checkpoints, ZeRO and resharding never
// depend on the layout that wrote them. Parameters, gradients and optimizer moments
// each live in one arena with identical offsets: an optimizer or a gradient bucket can
// treat any of them as one flat buffer.
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace pentad {

enum class Init { Normal, Ones, Zeros };

struct ParamSpec {
  std::string name;     // global identity, e.g. "layers.3.attn.q.weight" (HF-like)
  Shape global_shape;   // shape of the whole parameter across all ranks
  Init init = Init::Normal;
  float init_std = 0.0f;
  bool weight_decay = false;  // matrices and embeddings decay; norms and biases do not

  // The slice this rank holds: [shard_start, shard_start + local_shape[shard_dim]) along
  // shard_dim, whole along other dims. shard_dim = -1: replicated (one rank: always).
  int shard_dim = -1;
  int64_t shard_start = 0;
  Shape local_shape;

  size_t offset = 0;    // element offset in each arena

  // A copy of a parameter another pipeline stage holds (the tied embedding on the last
  // stage): kept equal by summing both gradients, so it is not saved, dumped or counted
  // in the gradient norm here.
  bool pipeline_copy = false;
};

class ParamStore {
 public:
  // Adds a parameter held whole on this rank; returns its id.
  int add(std::string name, Shape shape, Init init, float init_std, bool weight_decay);
  // Adds a parameter of global shape `shape` of which this rank holds
  // [shard_start, shard_start + shard_len) along shard_dim.
  int add_shard(std::string name, Shape shape, Init init, float init_std, bool weight_decay,
                int shard_dim, int64_t shard_start, int64_t shard_len);
  void mark_pipeline_copy(int id) { specs_.at(static_cast<size_t>(id)).pipeline_copy = true; }
  // Allocates params, grads (and nothing else: the optimizer owns its state).
  void allocate();
  // Fills every parameter from the seed: element i of parameter "name" is a function of
  // (seed, name, global index i) only, so any slice of any layout draws the same values.
  void initialize(uint64_t seed);

  Tensor param(int id) const { return view(params_.base(), id); }
  Tensor grad(int id) const { return view(grads_.base(), id); }
  // Parameter id's view inside any buffer laid out like the parameter arena (optimizer
  // moments, checkpoint staging, ...).
  Tensor view(void* base, int id) const;
  Tensor all_params() const;  // flat (numel) views over the whole arena
  Tensor all_grads() const;
  void zero_grads();

  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec& spec(int id) const { return specs_[static_cast<size_t>(id)]; }
  int find(const std::string& name) const;  // -1 when absent
  int64_t numel() const { return numel_; }  // local elements
  size_t bytes() const { return static_cast<size_t>(numel_) * sizeof(float); }

 private:
  std::vector<ParamSpec> specs_;
  int64_t numel_ = 0;
  Arena params_, grads_;
};

}  // namespace pentad
