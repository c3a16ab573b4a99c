#include "parallel/pp/layout.h"

#include <fmt/ranges.h>

#include <numeric>
#include <sstream>

#include "core/check.h"

namespace pentad::parallel::pp {

std::vector<int64_t> chunk_layers(int64_t n_layer, int stages, int virtual_stages,
                                  const std::string& layout) {
  const int64_t chunks = int64_t(stages) * virtual_stages;
  std::vector<int64_t> layers;
  if (chunks > n_layer)
    fail(
        "model.n_layer = {} cannot fill parallel.pp = {} x parallel.virtual_stages = {} = {} "
        "chunks of at least one layer: lower parallel.pp or parallel.virtual_stages",
        n_layer, stages, virtual_stages, chunks);
  if (layout.empty()) {
    if (n_layer % chunks != 0) {
      std::vector<std::string> example;
      for (int64_t j = 0; j < chunks; ++j)
        example.push_back(std::to_string(n_layer / chunks + (j < n_layer % chunks ? 1 : 0)));
      fail(
          "model.n_layer = {} does not split evenly into parallel.pp = {} x "
          "parallel.virtual_stages = {} = {} chunks: change parallel.pp or "
          "parallel.virtual_stages, or give parallel.pp_layout (layers per chunk, e.g. \"{}\")",
          n_layer, stages, virtual_stages, chunks, fmt::format("{}", fmt::join(example, ",")));
    }
    layers.assign(size_t(chunks), n_layer / chunks);
    return layers;
  }
  std::stringstream in(layout);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t n = 0;
    try {
      n = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || item.find_first_not_of(" 0123456789", 0) != std::string::npos || n < 1)
      fail("parallel.pp_layout = \"{}\": \"{}\" is not a layer count of at least 1", layout, item);
    layers.push_back(n);
  }
  if (int64_t(layers.size()) != chunks)
    fail(
        "parallel.pp_layout = \"{}\" lists {} chunks but parallel.pp = {} x "
        "parallel.virtual_stages = {} needs {}",
        layout, layers.size(), stages, virtual_stages, chunks);
  const int64_t sum = std::accumulate(layers.begin(), layers.end(), int64_t{0});
  if (sum != n_layer)
    fail("parallel.pp_layout = \"{}\" adds up to {} layers but model.n_layer = {}", layout, sum,
         n_layer);
  return layers;
}

std::vector<Chunk> stage_chunks(const std::vector<int64_t>& layers, int stages, int stage,
                                bool vee) {
  const int total = int(layers.size());
  const ChunkPlacement placement{stages, total / stages, vee};
  std::vector<Chunk> out;
  for (int c = 0; c < placement.chunks; ++c) {
    const int j = placement.virtual_stage(stage, c);
    const int64_t begin = std::accumulate(layers.begin(), layers.begin() + j, int64_t{0});
    out.push_back({begin, begin + layers[size_t(j)], j == 0, j == total - 1});
  }
  return out;
}

}  // namespace pentad::parallel::pp
