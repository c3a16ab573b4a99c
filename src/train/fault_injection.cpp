#include "train/fault_injection.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "parallel/activity.h"

namespace pentad {
namespace {

std::vector<std::string> split(const std::string& spec) {
  std::vector<std::string> part;
  for (size_t at = 0, next = 0; next != std::string::npos; at = next + 1) {
    next = spec.find(':', at);
    part.push_back(spec.substr(at, next == std::string::npos ? next : next - at));
  }
  return part;
}

// A whole number in field `what` of `key = spec`, or an error saying which one is wrong.
int64_t whole(const std::string& text, const char* key, const std::string& spec, const char* what) {
  size_t used = 0;
  int64_t value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || value < 0)
    fail("{} = \"{}\": {} \"{}\" is not a whole number >= 0", key, spec, what, text);
  return value;
}

}  // namespace

FaultInjector::FaultInjector(const Config& cfg, parallel::Mesh* mesh, int world_rank,
                             std::string checkpoint_root)
    : cfg_(cfg),
      mesh_(mesh),
      world_rank_(world_rank),
      checkpoint_root_(std::move(checkpoint_root)) {
  parse();
}

void FaultInjector::parse() {
  if (const std::string& spec = cfg_.train.inject_nan_grad; !spec.empty()) {
    const std::vector<std::string> part = split(spec);
    if (part.size() != 2) fail("train.inject_nan_grad = \"{}\": want RANK:STEP", spec);
    const int64_t rank = whole(part[0], "train.inject_nan_grad", spec, "RANK");
    const int64_t step = whole(part[1], "train.inject_nan_grad", spec, "STEP");
    if (rank == world_rank_) nan_step_ = step;
  }
  const std::string& spec = cfg_.train.inject_fault;
  // Restarts run clean, unless a test wants a fault that comes back every time.
  const char* attempt = std::getenv("PENTAD_LAUNCH_ATTEMPT");
  const bool again = std::getenv("PENTAD_INJECT_EVERY_ATTEMPT") != nullptr;
  if (spec.empty() || (attempt && std::string(attempt) != "0" && !again)) return;
  const char* key = "train.inject_fault";
  const std::vector<std::string> part = split(spec);
  fault_kind_ = part[0];
  if (fault_kind_ == "slowlink") {
    if (!(part.size() == 4 || part.size() == 5))
      fail("{} = \"{}\": want slowlink:A:B:STEP[:MS] (world ranks A and B)", key, spec);
    link_a_ = int(whole(part[1], key, spec, "A"));
    link_b_ = int(whole(part[2], key, spec, "B"));
    const int world = mesh_ ? mesh_->world().size() : 1;
    if (!(link_a_ != link_b_ && link_a_ < world && link_b_ < world))
      fail("{} = \"{}\": A and B must be two different world ranks below {}", key, spec, world);
    // The delay is on sends that name their peer: pentad's ring all-reduce and ZeRO's ring
    // reduce-scatter on the host, the pipeline's transfers, ring attention. MPI's own
    // collectives name none, so without those nothing would slow down.
    // Both rings run on host memory only: on a GPU the gradients go through NCCL.
    const ParallelConfig& par = cfg_.parallel;
    const bool host = cfg_.train.device == "cpu";
    if (!(host && (par.ring_all_reduce || par.zero > 0)) && par.pp == 1 && par.cp == 1)
      fail(
          "{} = \"{}\" delays sends between ranks {} and {}, but this layout sends none that "
          "name their peer (MPI's and NCCL's all-reduces do not): on the CPU keep "
          "parallel.ring_all_reduce = true (the default) or set parallel.zero >= 1, or use "
          "pipeline or context parallelism",
          key, spec, link_a_, link_b_);
    fault_step_ = whole(part[3], key, spec, "STEP");  // every rank: each sets its groups
    fault_factor_ = part.size() == 5 ? double(whole(part[4], key, spec, "MS")) : 20.0;
    return;
  }
  if (!(part.size() >= 3 && part.size() <= 4))
    fail("{} = \"{}\": want KIND:RANK:STEP[:FACTOR] or slowlink:A:B:STEP[:MS]", key, spec);
  static const std::array<std::string_view, 8> kinds = {"kill", "stop", "hang",    "commhang",
                                                        "slow", "nan",  "corrupt", "error"};
  if (std::find(kinds.begin(), kinds.end(), fault_kind_) == kinds.end())
    fail("{}: unknown kind \"{}\" ({}, slowlink)", key, fault_kind_, fmt::join(kinds, ", "));
  if (fault_kind_ == "corrupt" && cfg_.train.save_every <= 0)
    fail("{} = \"{}\" corrupts a checkpoint, but train.save_every = 0 saves none", key, spec);
  const int64_t step = whole(part[2], key, spec, "STEP");
  if (part.size() > 3) {
    size_t used = 0;
    try {
      fault_factor_ = std::stod(part[3], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != part[3].size() || !(fault_factor_ > 0))
      fail("{} = \"{}\": FACTOR \"{}\" is not a number > 0", key, spec, part[3]);
  }
  if (whole(part[1], key, spec, "RANK") != world_rank_) return;
  if (fault_kind_ == "nan")
    nan_step_ = step;  // the same injection as train.inject_nan_grad
  else
    fault_step_ = step;
}

void FaultInjector::before_step(int64_t step) {
  slow_factor_ = std::max(slow_factor_, strike(step));
}

double FaultInjector::strike(int64_t step) {
  if (fault_kind_ == "corrupt" && fault_step_ > 0 && step + 1 >= fault_step_) {
    corrupt_newest_checkpoint();  // returns while none is committed yet
    return 1.0;
  }
  // A link slow from step STEP on: a run resumed past it (PENTAD_INJECT_EVERY_ATTEMPT) finds
  // it slow from its first step.
  if (fault_kind_ == "slowlink" && !link_slowed_ && fault_step_ > 0 && step + 1 >= fault_step_) {
    link_slowed_ = true;
    if (world_rank_ == link_a_ || world_rank_ == link_b_)
      spdlog::warn("injected fault: link {}-{} {} ms slow from step {}", link_a_, link_b_,
                   fault_factor_, step + 1);
    inject_slow_link();
    return 1.0;
  }
  if (step + 1 != fault_step_ || fault_kind_ == "slowlink") return 1.0;
  spdlog::warn("injected fault: {} of rank {} at step {}", fault_kind_, world_rank_, step + 1);
  if (fault_kind_ == "kill") std::raise(SIGKILL);
  if (fault_kind_ == "stop") std::raise(SIGSTOP);
  if (fault_kind_ == "hang")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  if (fault_kind_ == "commhang") {  // a receive from this rank itself, which it never sends
    int32_t never = 0;
    mesh_->world().recv(view_of(&never, Shape{1}, DType::I32), world_rank_, 999);
  }
  if (fault_kind_ == "error")  // thrown while the other ranks go on into the step's collectives
    fail("injected error on rank {} at step {}", world_rank_, step + 1);
  return fault_kind_ == "slow" ? fault_factor_ : 1.0;
}

void FaultInjector::inject_slow_link() const {
  if (!mesh_) return;
  using parallel::Axis;
  std::vector<parallel::Communicator*> groups = {&mesh_->dp_cp(), &mesh_->world()};
  for (Axis axis : {Axis::TP, Axis::CP, Axis::DP, Axis::PP, Axis::EP, Axis::EDP})
    groups.push_back(&mesh_->group(axis));
  for (parallel::Communicator* g : groups) {
    const std::vector<int> members = g->world_ranks();
    int a = -1, b = -1;
    for (int r = 0; r < int(members.size()); ++r) {
      if (members[size_t(r)] == link_a_) a = r;
      if (members[size_t(r)] == link_b_) b = r;
    }
    // Sends between the two ends only; collectives of the backend's own are not delayed
    // (their transfers name no peer: parallel.ring_all_reduce makes dp's all-reduce sends,
    // ZeRO's host reduce-scatter always is).
    if (a >= 0 && b >= 0) g->set_injection({fault_factor_ * 1e-3, a, 0, /*links_only=*/true, b});
  }
}

void FaultInjector::corrupt_newest_checkpoint() {
  // The checkpoint at or before the step asked for, once committed (commits lag the save by
  // a step or more: the files are written in the background).
  const int64_t newest = parallel::activity_progress().ckpt_step;
  const int64_t every = cfg_.train.save_every;
  if (newest <= 0 || newest < fault_step_ / every * every) return;
  // This rank's file; or, when it wrote none (a data-parallel replica: the lowest rank of
  // equal state writes), the first rank file there.
  const std::string dir = ckpt::checkpoint_dir(checkpoint_root_, newest);
  std::string path = dir + "/" + ckpt::rank_file_name(world_rank_);
  if (!std::filesystem::exists(path)) {
    std::vector<std::string> files;
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (entry.path().extension() == ".h5") files.push_back(entry.path().string());
    if (files.empty()) fail("train.inject_fault corrupt: no rank file in {}", dir);
    path = *std::min_element(files.begin(), files.end());
  }
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  if (!file.good()) fail("train.inject_fault corrupt: cannot open {}", path);
  const auto size = std::filesystem::file_size(path);
  // The middle of the file: inside the tensor data (the metadata sits at the start).
  file.seekg(std::streamoff(size / 2));
  char bytes[4] = {};
  file.read(bytes, sizeof(bytes));
  for (char& c : bytes) c = char(~c);
  file.seekp(std::streamoff(size / 2));
  file.write(bytes, sizeof(bytes));
  file.close();
  spdlog::warn("injected fault: corrupted {} (4 bytes at offset {}), now SIGKILL of rank {}", path,
               size / 2, world_rank_);
  std::raise(SIGKILL);
}

bool FaultInjector::stretch_compute(double start_cpu) const {
  if (slow_factor_ <= 1.0) return false;
  const double now = parallel::thread_cpu_seconds();
  const double until = now + (slow_factor_ - 1.0) * (now - start_cpu);
  while (parallel::thread_cpu_seconds() < until) {
  }
  return true;
}

}  // namespace pentad
