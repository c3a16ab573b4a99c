#include "cli/checkpoint_params.h"

#include <algorithm>

#include "core/check.h"
#include "recipe/recipe.h"

namespace pentad::ckpt {

int64_t numel(const Dims& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

Shape to_shape(const Dims& dims) {
  PENTAD_CHECK(dims.size() <= static_cast<size_t>(kMaxDims), "{} dims", dims.size());
  Shape s;
  s.ndim = static_cast<int>(dims.size());
  std::copy(dims.begin(), dims.end(), s.dims.begin());
  return s;
}

Dims dims_of(const Shape& shape) {
  return Dims(shape.dims.begin(), shape.dims.begin() + shape.ndim);
}

CheckpointParams::CheckpointParams(const std::string& dir)
    : reader_(dir), config_(parse_recipe(reader_.manifest().recipe_toml, dir + "/manifest.json")) {}

std::vector<float> CheckpointParams::get(const std::string& name, const Dims& dims) {
  const std::string full = "param/" + name;
  if (!reader_.has(full))
    fail("{}: no tensor {} (the recipe describes a {} model that has it)", reader_.dir(), full,
         model().family == ModelFamily::GPT2 ? "gpt2" : "llama");
  std::vector<float> v(static_cast<size_t>(numel(dims)));
  const Shape s = to_shape(dims);
  reader_.read(full, s, -1, 0, s, v.data());
  return v;
}

}  // namespace pentad::ckpt
