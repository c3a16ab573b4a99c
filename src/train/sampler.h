#pragma once
// train.sample_every: a short greedy sample from the current weights, printed by world rank 0
// (as llm.c does), so a run shows what the model writes as it learns. It runs on a model of
// its own (model/generate.h) filled with a copy of the trained parameters: the training
// arenas, RNG and losses are untouched.
#include <cstdint>
#include <memory>
#include <optional>

#include "data/tokenizer.h"
#include "model/generate.h"
#include "parallel/mesh.h"
#include "recipe/config.h"

namespace pentad {

// Refuses train.sample_every under a layout where one rank does not hold the whole model
// (tp, pp, ep, etp, ZeRO-3 over more than one rank): a sample from a shard would be wrong.
void check_sample_layout(const Config& cfg, const parallel::Mesh* mesh);

class TrainingSampler {
 public:
  static constexpr int64_t kTokens = 32;

  explicit TrainingSampler(const Config& cfg);
  // Copies `trained`'s parameters (whole on this rank) and logs kTokens greedy tokens from
  // the end-of-text token, as text when the recipe's tokenizer is on disk, else as ids.
  void print(const Model& trained, int64_t step);

 private:
  Config cfg_;
  std::unique_ptr<Generator> gen_;  // made at the first sample
  std::optional<data::Tokenizer> tokenizer_;
};

}  // namespace pentad
