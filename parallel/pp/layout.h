#pragma once
// How a model's layers are cut into pipeline chunks: p stages, each running v chunks
// (virtual stages) of contiguous layers. Chunk j of the p * v, in model order, is virtual
// stage j. In the loop placement (the interleaved layout of Narayanan et al. 2021) it runs on
// stage j % p; in the V placement (ZB-V, Qi et al. 2024) every odd pass over the stages runs
// backwards, so virtual stages p-1 and p share stage p-1, and with v = 2 stage 0 holds both
// the first and the last chunk. With v = 1 both place chunk s on stage s.
#include <cstdint>
#include <string>
#include <vector>

namespace pentad::parallel::pp {

// A contiguous range of layers run together; first: it starts with the embedding (virtual
// stage 0); last: it ends with the final norm, the head and the loss (the last virtual stage).
struct Chunk {
  int64_t layer_begin = 0, layer_end = 0;
  bool first = true, last = true;
};

// Which virtual stage chunk c of stage s runs, and back.
struct ChunkPlacement {
  int stages = 1;    // p
  int chunks = 1;    // v per stage
  bool vee = false;  // the V placement; the loop otherwise
  int virtual_stages() const { return stages * chunks; }
  int virtual_stage(int stage, int chunk) const {
    return chunk * stages + (vee && chunk % 2 == 1 ? stages - 1 - stage : stage);
  }
  int stage_of(int virtual_stage) const {
    const int within = virtual_stage % stages;
    return vee && (virtual_stage / stages) % 2 == 1 ? stages - 1 - within : within;
  }
  int chunk_of(int virtual_stage) const { return virtual_stage / stages; }
};

// What each layer costs, and what the first chunk (the embedding) and the last (the final
// norm, the head and the loss) add, in one unit (src/ counts FLOPs: plan/layout.h).
struct LayerCosts {
  std::vector<double> layers;  // one a layer, in model order
  double first = 0, last = 0;
};

// Layers of each model chunk (p * v of them, in model order): `layout` ("3,5": layers per
// chunk), "balanced" (balanced_chunk_layers over `costs`, which it then needs) or an even
// split (""). Throws pentad::Error naming the key to change when the layers do not split
// that way.
std::vector<int64_t> chunk_layers(int64_t n_layer, int stages, int virtual_stages,
                                  const std::string& layout, const LayerCosts* costs = nullptr);
// The cut of costs.layers into `chunks` contiguous chunks of at least one layer whose
// costliest chunk costs least and, of those, whose chunks' costs are the most even (the
// least sum of squares). Equal chunks cost the same on every stage under any placement, so
// a pipeline whose head outweighs a layer gives the last chunk fewer layers. Exact (dynamic
// programming, O(chunks x layers^2)).
std::vector<int64_t> balanced_chunk_layers(const LayerCosts& costs, int64_t chunks);
// Each chunk's cost under a cut (layers per chunk, in model order).
std::vector<double> chunk_costs(const LayerCosts& costs, const std::vector<int64_t>& layers);
// Stage s's chunks in parameter order: chunk c is model chunk ChunkPlacement{stages, v,
// vee}.virtual_stage(s, c), v being layers.size() / stages.
std::vector<Chunk> stage_chunks(const std::vector<int64_t>& layers, int stages, int stage,
                                bool vee = false);

}  // namespace pentad::parallel::pp
