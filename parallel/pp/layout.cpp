#include "parallel/pp/layout.h"

#include <fmt/ranges.h>

#include <limits>
#include <numeric>
#include <sstream>
#include <utility>

#include "core/check.h"

namespace pentad::parallel::pp {

std::vector<int64_t> balanced_chunk_layers(const LayerCosts& costs, int64_t chunks) {
  const int64_t n = int64_t(costs.layers.size());
  PENTAD_CHECK(chunks >= 1 && chunks <= n, "{} chunks of {} layers", chunks, n);
  std::vector<double> prefix(size_t(n) + 1, 0.0);
  for (int64_t l = 0; l < n; ++l)
    prefix[size_t(l) + 1] = prefix[size_t(l)] + costs.layers[size_t(l)];
  // Chunk j holds layers [begin, end).
  auto cost = [&](int64_t j, int64_t begin, int64_t end) {
    return prefix[size_t(end)] - prefix[size_t(begin)] + (j == 0 ? costs.first : 0.0) +
           (j == chunks - 1 ? costs.last : 0.0);
  };
  const double inf = std::numeric_limits<double>::infinity();
  // best[j][e]: over the cuts of layers [0, e) into chunks 0..j, the least costliest chunk
  // (pass 1), then the least sum of squares with every chunk within the bound (pass 2);
  // from[j][e] the chosen chunk j's first layer.
  auto solve = [&](double bound, bool squares) {
    std::vector<std::vector<double>> best(size_t(chunks), std::vector<double>(size_t(n) + 1, inf));
    std::vector<std::vector<int64_t>> from(size_t(chunks), std::vector<int64_t>(size_t(n) + 1, -1));
    for (int64_t e = 1; e <= n - (chunks - 1); ++e) {
      const double c = cost(0, 0, e);
      if (c <= bound) best[0][size_t(e)] = squares ? c * c : c, from[0][size_t(e)] = 0;
    }
    for (int64_t j = 1; j < chunks; ++j)
      for (int64_t e = j + 1; e <= n - (chunks - 1 - j); ++e)
        for (int64_t b = j; b < e; ++b) {
          const double before = best[size_t(j - 1)][size_t(b)];
          if (before == inf) continue;
          const double c = cost(j, b, e);
          if (c > bound) continue;
          const double total = squares ? before + c * c : std::max(before, c);
          if (total < best[size_t(j)][size_t(e)])
            best[size_t(j)][size_t(e)] = total, from[size_t(j)][size_t(e)] = b;
        }
    std::vector<int64_t> layers(static_cast<size_t>(chunks));
    for (int64_t j = chunks - 1, e = n; j >= 0; --j) {
      const int64_t b = from[size_t(j)][size_t(e)];
      PENTAD_CHECK(b >= 0, "balanced_chunk_layers: no cut within {}", bound);
      layers[size_t(j)] = e - b;
      e = b;
    }
    return std::make_pair(best[size_t(chunks - 1)][size_t(n)], layers);
  };
  const double least_max = solve(inf, false).first;
  // Within rounding of the least: sums in another order may differ in the last bits.
  return solve(least_max * (1 + 1e-9), true).second;
}

std::vector<double> chunk_costs(const LayerCosts& costs, const std::vector<int64_t>& layers) {
  std::vector<double> out;
  int64_t begin = 0;
  for (size_t j = 0; j < layers.size(); ++j) {
    const int64_t end = begin + layers[j];
    PENTAD_CHECK(end <= int64_t(costs.layers.size()), "a cut of {} layers past {}", end,
                 costs.layers.size());
    double c = std::accumulate(costs.layers.begin() + begin, costs.layers.begin() + end, 0.0);
    if (j == 0) c += costs.first;
    if (j + 1 == layers.size()) c += costs.last;
    out.push_back(c);
    begin = end;
  }
  return out;
}

std::vector<int64_t> chunk_layers(int64_t n_layer, int stages, int virtual_stages,
                                  const std::string& layout, const LayerCosts* costs) {
  const int64_t chunks = int64_t(stages) * virtual_stages;
  std::vector<int64_t> layers;
  if (chunks > n_layer)
    fail(
        "model.n_layer = {} cannot fill parallel.pp = {} x parallel.virtual_stages = {} = {} "
        "chunks of at least one layer: lower parallel.pp or parallel.virtual_stages",
        n_layer, stages, virtual_stages, chunks);
  if (layout == "balanced") {
    PENTAD_CHECK(costs && int64_t(costs->layers.size()) == n_layer,
                 "parallel.pp_layout = \"balanced\" needs each layer's cost");
    return balanced_chunk_layers(*costs, chunks);
  }
  if (layout.empty()) {
    if (n_layer % chunks != 0) {
      std::vector<std::string> example;
      for (int64_t j = 0; j < chunks; ++j)
        example.push_back(std::to_string(n_layer / chunks + (j < n_layer % chunks ? 1 : 0)));
      fail(
          "model.n_layer = {} does not split evenly into parallel.pp = {} x "
          "parallel.virtual_stages = {} = {} chunks: change parallel.pp or "
          "parallel.virtual_stages, or give parallel.pp_layout (layers per chunk, e.g. \"{}\", "
          "or \"balanced\")",
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
      fail(
          "parallel.pp_layout = \"{}\": \"{}\" is not a layer count of at least 1 (or give "
          "\"balanced\", or \"\" for an even split)",
          layout, item);
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
