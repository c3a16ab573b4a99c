#include "launch/store_check.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "core/tensor.h"

namespace pentad::launch {

namespace fs = std::filesystem;

namespace {

// /proc/self/mountinfo escapes a space as \040 (and \011, \012, \134 likewise).
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      const std::string octal = s.substr(i + 1, 3);
      if (octal.find_first_not_of("01234567") == std::string::npos) {
        out += char(std::stoi(octal, nullptr, 8));
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

// The mount that holds `path` (an existing, canonical path): its mount point and type.
void find_mount(const std::string& path, StoreCheck* c) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  size_t best = 0;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string id, parent, device, root, point, word;
    words >> id >> parent >> device >> root >> point;
    point = unescape(point);
    while (words >> word && word != "-") {
    }
    std::string type;
    words >> type;
    const bool inside =
        path == point || point == "/" ||
        (path.rfind(point, 0) == 0 && path.size() > point.size() && path[point.size()] == '/');
    if (inside && point.size() >= best) {  // later lines mount over earlier ones
      best = point.size();
      c->mount_point = point;
      c->fs_type = type;
    }
  }
}

// The directory itself, or its nearest existing ancestor.
fs::path existing(const fs::path& dir) {
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec);
  while (!p.empty() && !fs::exists(p, ec) && p != p.parent_path()) p = p.parent_path();
  return fs::canonical(p, ec);
}

std::string where(const StoreCheck& c) {
  return c.mount_point.empty() ? std::string()
                               : fmt::format(" (file system {} mounted at {})",
                                             c.fs_type.empty() ? "?" : c.fs_type, c.mount_point);
}

}  // namespace

int64_t bytes_on_disk(const std::string& dir) {
  std::error_code ec;
  int64_t bytes = 0;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode))
      bytes += int64_t(st.st_blocks) * 512;
  }
  return bytes;
}

StoreCheck check_store(const std::string& root, const StoreExpectation& expect) {
  StoreCheck c;
  const bool holds = expect.committed_step >= 0 || expect.committed_before;
  if (!holds && !expect.saves_failed) return c;
  std::error_code ec;
  find_mount(existing(root).string(), &c);
  const std::string newest = expect.committed_step >= 0
                                 ? ckpt::checkpoint_dir(root, expect.committed_step)
                                 : std::string();
  if (!fs::is_directory(root, ec)) {
    c.blocked = "checkpoint_dir";
    c.words = fmt::format("the checkpoint directory {} is gone{}", root, where(c));
    return c;
  }
  // The ranks' reports lag (a beat every 100 ms; the oldest rank's is taken): retention may
  // have retired the checkpoint they name in favour of newer ones, which serve as well.
  const std::vector<std::string> committed = ckpt::committed_checkpoints(root);
  bool newer_kept = false;
  for (const std::string& dir : committed)
    newer_kept = newer_kept || ckpt::checkpoint_step(dir).value_or(-1) >= expect.committed_step;
  if ((!newest.empty() && !newer_kept) || (newest.empty() && holds && committed.empty())) {
    c.blocked = "checkpoint_dir";
    c.words = fmt::format("{} no longer holds {}{}", root,
                          newest.empty() ? std::string("the checkpoints the job committed")
                                         : fs::path(newest).filename().string() +
                                               ", the newest checkpoint the job committed",
                          where(c));
    return c;
  }
  if (!expect.saves_failed) return c;
  struct statvfs st {};
  if (::statvfs(root.c_str(), &st) != 0) return c;  // nothing to judge: restart
  c.free_bytes = int64_t(st.f_bavail) * int64_t(st.f_frsize);
  if (committed.empty()) return c;  // no save to measure one by
  c.needed_bytes = bytes_on_disk(committed.front());
  const int64_t reusable = bytes_on_disk(ckpt::recycle_dir(root));
  if (c.free_bytes + reusable >= c.needed_bytes) return c;
  c.blocked = "checkpoint_space";
  c.words = fmt::format(
      "{}{}: {} free{}, a save needs {} (the size of {})", root, where(c),
      format_bytes(size_t(c.free_bytes)),
      reusable > 0 ? fmt::format(" and {} to reuse", format_bytes(size_t(reusable))) : "",
      format_bytes(size_t(c.needed_bytes)), fs::path(committed.front()).filename().string());
  return c;
}

}  // namespace pentad::launch
