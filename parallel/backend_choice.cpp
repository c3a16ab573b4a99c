#include "parallel/backend_choice.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "core/check.h"
#include "parallel/backend.h"

namespace pentad::parallel {

namespace {

// The first two ranks that share a GPU, or {-1, -1}.
std::pair<int, int> first_shared_gpu(std::span<const RankPlace> places) {
  std::map<std::pair<std::string, std::string>, int> first;
  for (int r = 0; r < int(places.size()); ++r) {
    const RankPlace& p = places[size_t(r)];
    const auto [at, fresh] = first.try_emplace({p.host, p.gpu}, r);
    if (!fresh) return {at->second, r};
  }
  return {-1, -1};
}

}  // namespace

BackendChoice choose_backend(std::string_view requested, bool on_gpu, bool nccl_built,
                             std::span<const RankPlace> places) {
  if (requested != "auto" && requested != "nccl" && requested != "staged")
    fail("parallel.comm_backend = \"{}\": use \"auto\", \"nccl\" or \"staged\"", requested);
  if (!on_gpu) {
    if (requested == "nccl")
      fail(
          "parallel.comm_backend = \"nccl\" needs train.device = \"cuda\" (NCCL moves device "
          "memory); a CPU run takes \"auto\" (MPI) or \"staged\"");
    if (requested == "staged")
      return {Backend::Staged,
              "parallel.comm_backend = \"staged\": host tensors copied through host staging"};
    return {Backend::MPI, ""};
  }
  const auto [a, b] = first_shared_gpu(places);
  const std::string shared = a < 0 ? ""
                                   : fmt::format("ranks {} and {} share GPU {} on {}", a, b,
                                                 places[size_t(b)].gpu, places[size_t(b)].host);
  if (requested == "staged") return {Backend::Staged, "parallel.comm_backend = \"staged\""};
  if (requested == "nccl") {
    if (!nccl_built)
      fail(
          "parallel.comm_backend = \"nccl\" but this pentad was built without NCCL; use "
          "\"auto\" or \"staged\" (collectives through host memory), or rebuild with NCCL");
    if (a >= 0)
      fail(
          "parallel.comm_backend = \"nccl\" but {}, and NCCL takes one GPU per rank; use "
          "\"auto\" or \"staged\" (collectives through host memory)",
          shared);
    return {Backend::NCCL, "parallel.comm_backend = \"nccl\""};
  }
  if (!nccl_built) return {Backend::Staged, "this pentad was built without NCCL"};
  if (a >= 0) return {Backend::Staged, shared + " (NCCL takes one GPU per rank)"};
  return {Backend::NCCL, "every rank has a GPU of its own"};
}

Backend select_backend(std::string_view requested, bool on_gpu, const std::string& gpu,
                       MPI_Comm world) {
  int initialized = 0, rank = 0, size = 1;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &size);
  }
  std::vector<RankPlace> places(static_cast<size_t>(size));
  if (on_gpu) {
    // Fixed-size records: a host name (MPI's longest) and a PCI bus id.
    constexpr size_t kGpu = 64;
    std::vector<char> mine(MPI_MAX_PROCESSOR_NAME + kGpu, '\0'), all(mine.size() * size_t(size));
    int length = 0;
    if (initialized) MPI_Get_processor_name(mine.data(), &length);
    std::strncpy(mine.data() + MPI_MAX_PROCESSOR_NAME, gpu.c_str(), kGpu - 1);
    if (initialized)
      MPI_Allgather(mine.data(), int(mine.size()), MPI_CHAR, all.data(), int(mine.size()), MPI_CHAR,
                    world);
    else
      all = mine;
    for (int r = 0; r < size; ++r) {
      const char* record = all.data() + size_t(r) * mine.size();
      places[size_t(r)].host.assign(record, strnlen(record, MPI_MAX_PROCESSOR_NAME));
      places[size_t(r)].gpu.assign(record + MPI_MAX_PROCESSOR_NAME,
                                   strnlen(record + MPI_MAX_PROCESSOR_NAME, kGpu));
    }
  }
  const BackendChoice choice = choose_backend(requested, on_gpu, nccl_compiled(), places);
  if (rank == 0 && !choice.reason.empty())
    spdlog::info("communicators: {} ({})", backend_name(choice.backend), choice.reason);
  return choice.backend;
}

}  // namespace pentad::parallel
