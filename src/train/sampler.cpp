#include "train/sampler.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/device_memory.h"
#include "data/corpus.h"

namespace pentad {

void check_sample_layout(const Config& cfg, const parallel::Mesh* mesh) {
  if (cfg.train.sample_every <= 0) return;
  std::string split;
  auto degree = [&](parallel::Axis axis) { return mesh ? mesh->degree(axis) : 1; };
  for (parallel::Axis axis :
       {parallel::Axis::TP, parallel::Axis::PP, parallel::Axis::EP, parallel::Axis::ETP})
    if (degree(axis) > 1)
      split += fmt::format("{}{} = {}", split.empty() ? "" : ", ", parallel::axis_name(axis),
                           degree(axis));
  if (cfg.parallel.zero == 3 && degree(parallel::Axis::DP) > 1)
    split +=
        fmt::format("{}ZeRO-3 over dp = {}", split.empty() ? "" : ", ", degree(parallel::Axis::DP));
  if (!split.empty())
    fail(
        "train.sample_every = {}: rank 0 holds only part of the model under this layout ({}), "
        "so it cannot sample from it; set train.sample_every = 0, or generate from a "
        "checkpoint with `pentad generate`",
        cfg.train.sample_every, split);
}

TrainingSampler::TrainingSampler(const Config& cfg) : cfg_(cfg) {
  const std::string path = data::default_corpus_tokenizer(cfg.data, cfg.model.vocab_size);
  if (cfg.data.source != "random" && std::filesystem::exists(path))
    tokenizer_ = data::Tokenizer::load(path);
}

void TrainingSampler::print(const Model& trained, int64_t step) {
  if (!gen_) gen_ = std::make_unique<Generator>(cfg_.model);
  ParamStore& dst = gen_->params();
  const ParamStore& src = trained.params();
  for (const ParamSpec& spec : dst.specs()) {
    const int id = src.find(spec.name);
    PENTAD_CHECK(id >= 0 && src.spec(id).local_shape.numel() == spec.global_shape.numel(),
                 "sample: parameter {} is not whole on this rank", spec.name);
    const Tensor from = src.param(id);  // the F32 master copy, on the training device
    const Tensor to = dst.param(dst.find(spec.name));
    copy_bytes(to.data, to.device, from.data, from.device, to.bytes());
  }
  gen_->reset();  // the cached keys and values are the last step's parameters'
  const int32_t start = tokenizer_ && tokenizer_->eot_id() >= 0
                            ? tokenizer_->eot_id()
                            : static_cast<int32_t>(cfg_.model.vocab_size - 1);
  std::vector<int32_t> tokens = {start};
  std::mt19937_64 rng(0);  // unused by greedy picks; the training RNG is not touched
  const int64_t end = std::min<int64_t>(1 + kTokens, gen_->context());
  while (static_cast<int64_t>(tokens.size()) < end) {
    const int32_t next = pick_token(gen_->next_logits(tokens), SamplingOptions{}, rng);
    if (tokenizer_ && next == tokenizer_->eot_id()) break;
    tokens.push_back(next);
  }
  const std::span<const int32_t> made(tokens.data() + 1, tokens.size() - 1);
  if (tokenizer_) {
    std::string text;  // one log line: newlines shown as \n
    for (char c : tokenizer_->decode(made))
      text += c == '\n' ? std::string("\\n") : std::string(1, c);
    spdlog::info("step {} sample: {}", step, text);
  } else {
    std::string ids;
    for (int32_t id : made) {  // (GCC 12 flags "" + to_string here, -Wrestrict, falsely)
      if (!ids.empty()) ids += ' ';
      ids += std::to_string(id);
    }
    spdlog::info("step {} sample (ids): {}", step, ids);
  }
}

}  // namespace pentad
