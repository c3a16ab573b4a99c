#pragma once
// How a model's layers are cut into pipeline chunks: p stages, each running v chunks
// (virtual stages) of contiguous layers. Chunk j of the p * v, in model order, is virtual
// stage j and runs on stage j % p (the interleaved layout of Narayanan et al. 2021); with
// v = 1, stage s runs chunk s only.
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

// Layers of each model chunk (p * v of them, in model order): `layout` ("3,5": layers per
// chunk) or an even split. Throws pentad::Error naming the key to change when the layers do
// not split that way.
std::vector<int64_t> chunk_layers(int64_t n_layer, int stages, int virtual_stages,
                                  const std::string& layout);
// Stage s's chunks in parameter order: chunk c is model chunk c * p + s.
std::vector<Chunk> stage_chunks(const std::vector<int64_t>& layers, int stages, int stage);

}  // namespace pentad::parallel::pp
