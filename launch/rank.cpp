#include "launch/rank.h"

#include <mpi.h>
#include <omp.h>

#include <algorithm>

#include "core/device_memory.h"
#include "train/layout.h"

namespace pentad::launch {

NodePlace node_place() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return {};
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  NodePlace place;
  MPI_Comm_rank(node, &place.rank);
  MPI_Comm_size(node, &place.size);
  MPI_Comm_free(&node);
  return place;
}

void set_compute_threads(int64_t threads, int ranks_on_node) {
  const int n = threads > 0 ? static_cast<int>(threads)
                            : std::max(1, omp_get_num_procs() / std::max(1, ranks_on_node));
  omp_set_num_threads(n);
}

parallel::Backend select_device(const Config& cfg) {
  if (placement(cfg).device == Device::CPU) return parallel::Backend::MPI;
  select_cuda_device(node_place().rank);
  return parallel::Backend::NCCL;
}

parallel::Backend start_rank(const Config& cfg) {
  set_compute_threads(cfg.train.threads, node_place().size);
  return select_device(cfg);
}

}  // namespace pentad::launch
