#pragma once
// Text generation from a trained model on one device (the CPU, or a GPU in fp32 or bf16):
// next-token logits of a growing sequence,
// and the sampling rules (greedy, temperature, top-k, top-p) that pick the next token.
// By default the logits come from Model::decode over a cache of keys and values
// (model/kv_cache.h): the prompt is run once (prefill), then each new token costs one row
// of every layer. Without the cache they come from the training forward itself (Model with
// micro-batch 1 and the model's context), run again over the whole padded prefix for each
// new token: causal attention makes the logits at position i depend only on tokens 0..i, so
// the unused tail does not matter. Both give the training forward's logits (generate_test).
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "model/model.h"

namespace pentad {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy (argmax, ties to the smallest id)
  int64_t top_k = 0;         // keep the k most likely tokens; 0: all
  double top_p = 1.0;        // keep the smallest set of tokens whose mass reaches p
  uint64_t seed = 0;
};

// Throws pentad::Error naming the option when a value is out of range.
void check_sampling(const SamplingOptions& options);

// The next token from one row of logits (V), by the options; rng drawn only when
// temperature > 0.
int32_t pick_token(std::span<const float> logits, const SamplingOptions& options,
                   std::mt19937_64& rng);

class Generator {
 public:
  // A one-device model of `cfg` for sequences up to cfg.max_seq_len tokens, on the
  // placement's device and in its compute type; its parameters are filled by the caller
  // through params(), then reset(). use_cache = false: every step is a full training forward
  // (the reference the cache is tested against).
  explicit Generator(const ModelConfig& cfg, bool use_cache = true, Placement placement = {});
  ParamStore& params() { return model_.params(); }
  int64_t context() const { return model_.seq_len(); }
  bool uses_cache() const { return cache_ != nullptr; }
  // Logits (V) of the token after `tokens` (1..context ids). With the cache, a call whose
  // tokens extend the previous call's decodes only the new ones; any other sequence starts
  // the cache again (prefill). On a device the logits are read back (the host waits).
  std::vector<float> next_logits(std::span<const int32_t> tokens);
  // Starts the cache again, and a bf16 model's compute copy follows the parameters: call it
  // after writing them through params().
  void reset();

 private:
  Model model_;
  std::vector<int32_t> padded_, targets_;
  std::unique_ptr<KvCache> cache_;  // null without the cache
  std::vector<int32_t> cached_;     // the tokens whose keys and values the cache holds
  std::vector<float> last_;         // the logits after cached_
};

}  // namespace pentad
