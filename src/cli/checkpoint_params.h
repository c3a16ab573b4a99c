#pragma once
// What the checkpoint converters (convert.cpp for Hugging Face, convert_llmc.cpp for llm.c)
// share: a committed checkpoint's parameters read whole, by name, with the recipe they
// belong to, and the shape helpers they use.
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/tensor.h"
#include "recipe/config.h"

namespace pentad::ckpt {

using Dims = std::vector<int64_t>;

int64_t numel(const Dims& dims);
Shape to_shape(const Dims& dims);
Dims dims_of(const Shape& shape);

// Parameters of a committed checkpoint, read whole, with the recipe they belong to.
class CheckpointParams {
 public:
  explicit CheckpointParams(const std::string& dir);

  const ModelConfig& model() const { return config_.model; }
  const Config& config() const { return config_; }  // the whole recipe it was saved with
  const Manifest& manifest() const { return reader_.manifest(); }
  const std::string& dir() const { return reader_.dir(); }
  // Whether the checkpoint holds parameter `name`.
  bool has(const std::string& name) const { return reader_.has("param/" + name); }
  // Parameter `name` ("param/<name>" in the checkpoint) with shape `dims`; throws
  // pentad::Error naming the checkpoint when it has no such tensor.
  std::vector<float> get(const std::string& name, const Dims& dims);

 private:
  Reader reader_;
  Config config_;
};

}  // namespace pentad::ckpt
