#include "checkpoint/memory_level.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/checksum.h"
#include "checkpoint/manifest.h"
#include "core/check.h"
#include "core/device_memory.h"

namespace pentad::ckpt {

namespace {

bool same_identity(const ShardInfo& a, const ShardInfo& b) {
  return a.name == b.name && a.global_shape == b.global_shape && a.shard_dim == b.shard_dim &&
         a.shard_start == b.shard_start && a.local_shape == b.local_shape &&
         a.row_start == b.row_start && a.shard_dim2 == b.shard_dim2 &&
         a.shard_start2 == b.shard_start2;
}

size_t staged_floats(const ShardInfo& s) {
  const auto n = static_cast<size_t>(s.local_shape.numel());
  return (n + kStagingAlignFloats - 1) / kStagingAlignFloats * kStagingAlignFloats;
}

}  // namespace

std::string MemoryLevel::prefix_for(const std::string& dir, const std::string& root, int rank) {
  std::error_code ec;
  std::string path = std::filesystem::weakly_canonical(std::filesystem::absolute(root), ec);
  if (ec) path = std::filesystem::absolute(root).lexically_normal().string();
  const uint64_t hash = checksum_of(ChecksumKind::Xxh3_64, path.data(), path.size());
  return fmt::format("{}/pentad-{:016x}-rank-{:05d}", dir, hash, rank);
}

std::vector<std::string> MemoryLevel::prefixes_from_rank(const std::string& prefix,
                                                         int first_rank) {
  const std::filesystem::path path(prefix);
  const std::string base = path.filename().string();
  const std::string stem = base.substr(0, base.rfind("-rank-") + 6);  // up to the digits
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(path.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.compare(0, stem.size(), stem) != 0 || name.size() < stem.size() + 7) continue;
    const std::string digits = name.substr(stem.size(), 5), rest = name.substr(stem.size() + 5);
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    if (rest != ".0" && rest != ".1" && rest != ".0.json" && rest != ".1.json") continue;
    if (std::stoi(digits) < first_rank) continue;
    const std::string other = (path.parent_path() / (stem + digits)).string();
    if (std::find(found.begin(), found.end(), other) == found.end()) found.push_back(other);
  }
  std::sort(found.begin(), found.end());
  return found;
}

MemoryLevel::MemoryLevel(std::string prefix) : prefix_(std::move(prefix)) {
  for (int s = 0; s < 2; ++s) {
    slots_[s].set_shared_staging(data_file(s));
    slots_[s].set_on_copied([this, s] {
      // The copy is whole: its index, by a rename, makes the slot a complete snapshot.
      Manifest m = pending_[s];
      const std::string file = std::filesystem::path(data_file(s)).filename().string();
      for (const ShardInfo& shard : slots_[s].staged_shards()) m.shards.push_back({file, shard});
      const std::string index = index_file(s), temp = index + ".tmp";
      {
        std::ofstream out(temp, std::ios::trunc);
        out << manifest_json(m);
        if (!out.flush()) fail("cannot write {}", temp);
      }
      if (std::rename(temp.c_str(), index.c_str()) != 0)
        fail("cannot rename {} to {}: {}", temp, index, std::strerror(errno));
    });
  }
}

std::string MemoryLevel::data_file(int slot) const {
  return fmt::format("{}.{}", prefix_, slot);
}

std::string MemoryLevel::index_file(int slot) const {
  return data_file(slot) + ".json";
}

void MemoryLevel::reserve(const std::vector<LiveTensor>& tensors) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(prefix_).parent_path(), ec);
  std::vector<bool> complete(2, false);
  for (const Held& h : held()) complete[static_cast<size_t>(h.slot)] = true;
  for (int s = 0; s < 2; ++s) slots_[s].reserve(tensors, !complete[static_cast<size_t>(s)]);
}

void MemoryLevel::take(const Manifest& base, std::vector<LiveTensor> tensors, bool asynchronous) {
  if (!started_) {  // keep the newest snapshot an earlier process left, where there is one
    const std::vector<Held> now = held();
    newest_ = now.empty() ? 1 : now.front().slot;
    started_ = true;
  }
  // The previous snapshot complete (its copy the optimizer followed, and its index) before
  // the other slot stops being one.
  slots_[newest_].wait_for_file();
  const int slot = 1 - newest_;
  if (std::remove(index_file(slot).c_str()) != 0 && errno != ENOENT)
    fail("cannot remove {}: {}", index_file(slot), std::strerror(errno));
  pending_[slot] = base;
  pending_[slot].shards.clear();
  slots_[slot].begin({}, std::move(tensors), asynchronous);
  newest_ = slot;
}

void MemoryLevel::settle() {
  for (AsyncSaver& slot : slots_) slot.wait_for_file();
}

std::vector<MemoryLevel::Held> MemoryLevel::held() const {
  std::vector<Held> held;
  for (int s = 0; s < 2; ++s) {
    std::error_code ec;
    if (!std::filesystem::exists(index_file(s), ec)) continue;
    try {
      held.push_back({s, parse_manifest(index_file(s), false)});
    } catch (const Error&) {
      // Not a snapshot this process can take: a later take() writes over it.
    }
  }
  std::sort(held.begin(), held.end(),
            [](const Held& a, const Held& b) { return a.manifest.step > b.manifest.step; });
  return held;
}

bool MemoryLevel::holds(const Manifest& index, const std::vector<LiveTensor>& tensors) {
  if (index.shards.size() != tensors.size()) return false;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!same_identity(index.shards[i].shard, tensors[i].info)) return false;
  return true;
}

void MemoryLevel::load(int slot, const std::vector<LiveTensor>& tensors) const {
  const std::string index = index_file(slot), data = data_file(slot);
  const Manifest m = parse_manifest(index, false);
  if (m.shards.size() != tensors.size())
    fail("{} holds {} tensors where this rank has {}: another layout", index, m.shards.size(),
         tensors.size());
  size_t floats = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!same_identity(m.shards[i].shard, tensors[i].info))
      fail("{} holds {} {} where this rank has {} {}: another layout", index,
           m.shards[i].shard.name, m.shards[i].shard.local_shape.str(), tensors[i].info.name,
           tensors[i].info.local_shape.str());
    PENTAD_CHECK(!tensors[i].from_caller, "the in-memory level holds state in memory only");
    floats += staged_floats(tensors[i].info);
  }
  if (floats == 0) return;
  const int fd = ::open(data.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open {}: {}", data, std::strerror(errno));
  struct stat st {};
  const size_t bytes = floats * sizeof(float);
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    ::close(fd);
    fail("{} is shorter ({} bytes) than its index {} says ({} bytes)", data, st.st_size, index,
         bytes);
  }
  void* mapped = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (mapped == MAP_FAILED) fail("cannot map {}: {}", data, std::strerror(err));
  const auto* base = static_cast<const float*>(mapped);
  try {
    // Every tensor checked before any is written: a damaged slot leaves the state as it was.
    size_t at = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const ShardInfo& s = m.shards[i].shard;
      const size_t n = static_cast<size_t>(s.local_shape.numel()) * sizeof(float);
      if (checksum_of(ChecksumKind::Xxh3_64, base + at, n) != s.checksum)
        fail("{}: tensor {} fails its checksum (the snapshot is damaged)", data, s.name);
      at += staged_floats(s);
    }
    at = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const LiveTensor& t = tensors[i];
      copy_bytes(t.live, t.device, base + at, Device::CPU,
                 static_cast<size_t>(t.info.local_shape.numel()) * sizeof(float));
      at += staged_floats(t.info);
    }
  } catch (...) {
    ::munmap(mapped, bytes);
    throw;
  }
  ::munmap(mapped, bytes);
}

void MemoryLevel::remove() {
  settle();
  for (int s = 0; s < 2; ++s)
    for (const std::string& file : {index_file(s), data_file(s)}) std::remove(file.c_str());
}

std::vector<std::string> MemoryLevel::set_aside(const std::string& suffix) {
  settle();
  std::vector<std::string> moved;
  for (int s = 0; s < 2; ++s)
    for (const std::string& file : {index_file(s), data_file(s)}) {
      const std::string to = file + "." + suffix;
      if (std::rename(file.c_str(), to.c_str()) == 0 && file == data_file(s)) moved.push_back(to);
    }
  return moved;
}

}  // namespace pentad::ckpt
