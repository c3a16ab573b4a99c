// Checkpoint directories: writing a rank's file, committing a step, retention, listing.
// Every file becomes visible only by rename after fsync, and a directory only by rename
// after everything in it is synced, so a crash leaves either the old or the new state.
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <tuple>

#include "checkpoint/box.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checksum.h"
#include "checkpoint/direct_io.h"
#include "checkpoint/h5.h"
#include "checkpoint/manifest.h"
#include "checkpoint/sha256.h"
#include "core/check.h"

namespace pentad::ckpt {

namespace fs = std::filesystem;

namespace {

void sync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0) fail("{}: cannot open it to sync: {}", path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail("{}: fsync failed: {}", path, std::strerror(err));
}

std::string parent_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

void rename_or_fail(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    fail("cannot rename {} to {}: {}", from, to, std::strerror(errno));
}

// text -> path.tmp, fsync, rename to path. The caller syncs the directory.
void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("{}: cannot create it: {}", tmp, std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      fail("{}: cannot write it: {}", tmp, std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail("{}: fsync failed: {}", tmp, std::strerror(err));
  rename_or_fail(tmp, path);
}

void check_shard(const ShardData& s) {
  const ShardInfo& i = s.info;
  PENTAD_CHECK(!i.name.empty(), "a shard without a name");
  PENTAD_CHECK(i.local_shape.ndim == i.global_shape.ndim && i.shard_dim >= -1 &&
                   i.shard_dim < i.global_shape.ndim,
               "{}: local {} global {} shard_dim {}", i.name, i.local_shape.str(),
               i.global_shape.str(), i.shard_dim);
  const Box b = shard_box(i.global_shape, i.shard_dim, i.shard_start, i.local_shape, i.row_start,
                          i.shard_dim2, i.shard_start2);
  PENTAD_CHECK(intersect(b, whole_box(i.global_shape)) == b && b.numel() == i.local_shape.numel(),
               "{}: local {} at {} along dim {} is not a slice of {}", i.name, i.local_shape.str(),
               i.shard_start, i.shard_dim, i.global_shape.str());
  PENTAD_CHECK(s.data || i.local_shape.numel() == 0, "{}: no data", i.name);
}

std::optional<int64_t> step_of(const std::string& dir_name, const char* suffix) {
  static const std::regex committed(R"(step-(\d{1,18}))");
  static const std::regex partial(R"(step-(\d{1,18})\.partial)");
  static const std::regex replaced(R"(step-(\d{1,18})\.replaced)");
  std::smatch m;
  const std::string s(suffix);
  const std::regex& pattern = s.empty() ? committed : s == ".partial" ? partial : replaced;
  if (!std::regex_match(dir_name, m, pattern)) return std::nullopt;
  return std::stoll(m[1].str());
}

// Directories on their way out: renamed (out of every listing) first, deleted afterwards.
constexpr const char* kRetiredSuffix = ".deleting";

// Renames dir to <dir>.deleting and adds that to `retired`, for deletion later. Where that
// name is taken (an earlier retirement of the same name not yet deleted) or the rename
// fails, deletes dir now.
void retire(const std::string& dir, std::vector<std::string>& retired) {
  const std::string target = dir + kRetiredSuffix;
  std::error_code ec;
  if (!fs::exists(target, ec) && std::rename(dir.c_str(), target.c_str()) == 0) {
    retired.push_back(target);
    return;
  }
  fs::remove_all(dir, ec);
}

// Every tensor's shards together must cover it: a commit never makes a checkpoint with
// holes the latest.
void check_coverage(const std::string& dir, const std::vector<Manifest::Entry>& entries) {
  std::map<std::string, std::vector<Box>> boxes;
  std::map<std::string, Shape> shapes;
  for (const Manifest::Entry& e : entries) {
    const ShardInfo& s = e.shard;
    auto [it, inserted] = shapes.emplace(s.name, s.global_shape);
    if (!inserted && !(it->second == s.global_shape))
      fail("{}: tensor {} has global shape {} in one rank file and {} in {}", dir, s.name,
           it->second.str(), s.global_shape.str(), e.file);
    boxes[s.name].push_back(shard_box(s.global_shape, s.shard_dim, s.shard_start, s.local_shape,
                                      s.row_start, s.shard_dim2, s.shard_start2));
  }
  for (const auto& [name, have] : boxes) {
    std::vector<Box> missing = {whole_box(shapes[name])};
    for (const Box& b : have) {
      std::vector<Box> left;
      for (const Box& m : missing)
        for (const Box& part : subtract(m, b)) left.push_back(part);
      missing = std::move(left);
    }
    if (!missing.empty())
      fail("{}: the rank files do not cover {} {}: not committing", dir, name,
           describe_gap(missing.front(), shapes[name]));
  }
}

// An upper bound on a rank file's bytes beyond its data, and its sidecar's: HDF5's
// superblock and object headers (measured: under 600 bytes a dataset with its
// attributes), the padding that puts datasets of 64 KiB and more on a 4 KiB boundary, and
// the sidecar's line per shard.
int64_t file_bytes_needed(const std::vector<ShardData>& shards) {
  int64_t bytes = 16 << 10;
  for (const ShardData& s : shards) {
    const int64_t data = s.info.local_shape.numel() * static_cast<int64_t>(sizeof(float));
    bytes += data + 1024 + (data >= (64 << 10) ? 4096 : 0);
  }
  return bytes;
}

// Fails, before anything is written, where the file system holding dir has no room for
// `bytes` (an error from the writes themselves would come later and in HDF5's words).
void check_free_space(const std::string& path, const std::string& dir, int64_t bytes) {
  struct statvfs fs_stat {};
  if (::statvfs(dir.c_str(), &fs_stat) != 0) return;  // the writes will say what is wrong
  const auto free_bytes =
      static_cast<int64_t>(fs_stat.f_bavail) * static_cast<int64_t>(fs_stat.f_frsize);
  if (free_bytes < bytes)
    fail("{}: {}: needs {} bytes ({}), {} bytes free", path, std::strerror(ENOSPC), bytes,
         format_bytes(static_cast<size_t>(bytes)), free_bytes);
}

std::vector<std::pair<int64_t, std::string>> step_dirs(const std::string& root,
                                                       bool with_manifest) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const fs::directory_entry& d : fs::directory_iterator(root, ec)) {
    const std::optional<int64_t> step = step_of(d.path().filename().string(), "");
    if (!step || !d.is_directory(ec)) continue;
    const std::string dir = d.path().string();
    if (fs::exists(dir + "/manifest.json", ec) == with_manifest) found.emplace_back(*step, dir);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a > b; });
  return found;
}

}  // namespace

std::string checkpoint_dir(const std::string& root, int64_t step) {
  return (fs::path(root) / fmt::format("step-{:08d}", step)).string();
}

std::string partial_dir(const std::string& root, int64_t step) {
  return checkpoint_dir(root, step) + ".partial";
}

std::string rank_file_name(int rank) {
  return fmt::format("rank-{:05d}.h5", rank);
}

std::string recycle_dir(const std::string& root) {
  return (fs::path(root) / "recycled").string();
}

bool write_rank_file(const std::string& path, const std::vector<ShardData>& shards, bool direct_io,
                     bool recycle) {
  // HDF5 (Debian's serial build) is not thread-safe: the saver's thread and a survivor's
  // write (write_survivor) take turns.
  static std::mutex one_at_a_time;
  std::lock_guard<std::mutex> lock(one_at_a_time);
  const std::string dir = parent_of(path);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("{}: cannot create the directory {}: {}", path, dir, ec.message());

  const std::string file_name = fs::path(path).filename().string();
  std::set<std::string> names;
  std::vector<ShardData> checked = shards;
  for (ShardData& s : checked) {
    check_shard(s);
    PENTAD_CHECK(names.insert(s.info.name).second, "{}: tensor {} written twice", path,
                 s.info.name);
    if (!s.checksummed)
      s.info.checksum =
          checksum_of(kWrittenChecksum, s.data, s.info.local_shape.numel() * sizeof(float));
  }

  // An earlier checkpoint's file of this rank, no longer kept (remove_dirs put it there):
  // its blocks are already allocated, so this file's data is written over them.
  const std::string recycled =
      recycle ? recycle_dir(parent_of(dir)) + "/" + file_name : std::string();
  const auto recycled_bytes = recycle ? static_cast<int64_t>(fs::file_size(recycled, ec)) : 0;
  check_free_space(path, dir, file_bytes_needed(checked) - (ec ? 0 : recycled_bytes));
  // HDF5 lays the file out and writes its metadata; the data goes where it said.
  const std::string tmp = path + ".tmp";
  const std::vector<int64_t> offsets = h5::create_file(tmp, path, checked);
  std::vector<Extent> extents;
  for (size_t i = 0; i < checked.size(); ++i)
    if (offsets[i] >= 0)
      extents.push_back({offsets[i], checked[i].data,
                         static_cast<size_t>(checked[i].info.local_shape.numel()) * sizeof(float)});
  std::string written = tmp;
  // Claimed by rename, so that no other writer can take it too; gone already is no error.
  if (recycle && std::rename(recycled.c_str(), (path + ".reused").c_str()) == 0) {
    written = path + ".reused";
    overlay_layout(tmp, written, path, extents);
    fs::remove(tmp, ec);
  }
  write_extents(written, path, extents, direct_io);  // and fsync
  rename_or_fail(written, path);
  std::vector<Manifest::Entry> entries;
  for (const ShardData& s : checked) entries.push_back({file_name, s.info});
  write_atomically(path + ".json", sidecar_json(entries));
  sync_path(dir, true);
  return written != tmp;
}

std::vector<std::string> commit(const std::string& root, const Manifest& base, int keep_last,
                                std::string_view tokenizer) {
  const std::string partial = partial_dir(root, base.step);
  const std::string final_dir = checkpoint_dir(root, base.step);
  if (!fs::is_directory(partial)) fail("{}: no such checkpoint directory to commit", partial);

  // Merge the sidecars, in rank order.
  std::vector<std::string> sidecars;
  for (const fs::directory_entry& f : fs::directory_iterator(partial)) {
    const std::string name = f.path().filename().string();
    if (name.size() > 8 && name.ends_with(".h5.json")) sidecars.push_back(f.path().string());
  }
  std::sort(sidecars.begin(), sidecars.end());
  if (sidecars.empty()) fail("{}: no rank files to commit", partial);
  Manifest manifest = base;
  manifest.checksum = checksum_name(kWrittenChecksum);  // the sidecars' (parse_sidecar checks)
  manifest.shards.clear();
  for (const std::string& sidecar : sidecars) {
    const std::string h5_file = sidecar.substr(0, sidecar.size() - 5);
    if (!fs::is_regular_file(h5_file)) fail("{}: missing (its sidecar exists)", h5_file);
    const std::string h5_name = fs::path(h5_file).filename().string();
    for (Manifest::Entry& e : parse_sidecar(sidecar)) {
      if (e.file != h5_name) fail("{}: lists shards of {}", sidecar, e.file);
      manifest.shards.push_back(std::move(e));
    }
  }
  check_coverage(partial, manifest.shards);
  if (!base.tokenizer_file.empty()) {
    PENTAD_CHECK(sha256_hex(tokenizer) == base.tokenizer_sha256, "{}: {} bytes for {} {}", partial,
                 tokenizer.size(), base.tokenizer_file, base.tokenizer_sha256);
    write_atomically(partial + "/" + base.tokenizer_file, std::string(tokenizer));
  }
  write_atomically(partial + "/manifest.json", manifest_json(manifest));
  sync_path(partial, true);

  // A committed directory for this step exists when a run resumed from an earlier step and
  // saved this step again: move it aside, move the new one in, then retire the old.
  const std::string replaced = final_dir + ".replaced";
  std::error_code ec;
  fs::remove_all(replaced, ec);
  const bool replacing = fs::exists(final_dir);
  if (replacing) rename_or_fail(final_dir, replaced);
  rename_or_fail(partial, final_dir);
  sync_path(root, true);
  std::vector<std::string> retired;
  if (replacing) retire(replaced, retired);

  // Retention. Errors here cost disk space, not correctness: ignore them.
  if (keep_last > 0) {
    const std::vector<std::string> committed = committed_checkpoints(root);
    for (size_t i = static_cast<size_t>(keep_last); i < committed.size(); ++i)
      retire(committed[i], retired);
  }
  std::vector<fs::path> stale;
  for (const fs::directory_entry& d : fs::directory_iterator(root, ec)) {
    const std::string name = d.path().filename().string();
    if (name.starts_with("step-") && name.ends_with(kRetiredSuffix)) {
      // Left by a run that stopped before deleting it (or just retired above).
      if (std::find(retired.begin(), retired.end(), d.path().string()) == retired.end())
        retired.push_back(d.path().string());
      continue;
    }
    for (const char* suffix : {".partial", ".replaced"}) {
      const std::optional<int64_t> step = step_of(name, suffix);
      if (step && *step < base.step) stale.push_back(d.path());
    }
  }
  for (const fs::path& p : stale) retire(p.string(), retired);
  return retired;
}

std::string carried_tokenizer(const std::string& dir, const Manifest& manifest) {
  if (manifest.tokenizer_file.empty()) return "";
  const std::string path = (fs::path(dir) / manifest.tokenizer_file).string();
  if (!fs::exists(path))
    fail("{}: missing; the checkpoint's manifest.json names it (sha256 {})", path,
         manifest.tokenizer_sha256);
  const std::string got = sha256_hex(read_text(path));
  if (got != manifest.tokenizer_sha256)
    fail("{}: sha256 {}, but the checkpoint's manifest.json records {}: the file was changed", path,
         got, manifest.tokenizer_sha256);
  return path;
}

std::optional<int64_t> checkpoint_step(const std::string& dir) {
  return step_of(fs::path(dir).filename().string(), "");
}

std::string set_aside(const std::string& dir, const std::string& folder) {
  const fs::path from(dir);
  const fs::path into = from.parent_path() / folder;
  std::error_code ec;
  fs::create_directories(into, ec);
  if (ec) fail("cannot create {} to move {} into: {}", into.string(), dir, ec.message());
  fs::path to = into / from.filename();
  for (int n = 1; fs::exists(to, ec); ++n)
    to = into / (from.filename().string() + "." + std::to_string(n));
  rename_or_fail(dir, to.string());
  sync_path(from.parent_path().string(), true);
  return to.string();
}

void pool_rank_files(const std::vector<std::string>& dirs) {
  std::error_code ec;  // errors cost the reuse only
  for (const std::string& dir : dirs) {
    const std::string pool = recycle_dir(parent_of(dir));
    fs::create_directories(pool, ec);
    std::vector<std::string> files;  // listed first: the loop below empties the directory
    for (const fs::directory_entry& f : fs::directory_iterator(dir, ec)) {
      std::string name = f.path().filename().string();
      if (name.starts_with("rank-") && name.ends_with(".h5")) files.push_back(std::move(name));
    }
    // Each replaces (and so frees) an older file of the same rank not reused meanwhile.
    for (const std::string& name : files)
      fs::rename(fs::path(dir) / name, fs::path(pool) / name, ec);
  }
}

void remove_dirs(const std::vector<std::string>& dirs) {
  std::error_code ec;
  for (const std::string& dir : dirs) fs::remove_all(dir, ec);  // errors cost space only
}

std::vector<std::string> committed_checkpoints(const std::string& root) {
  std::vector<std::string> dirs;
  for (auto& [step, dir] : step_dirs(root, true)) dirs.push_back(std::move(dir));
  return dirs;
}

std::vector<std::string> checkpoints_without_manifest(const std::string& root) {
  std::vector<std::string> dirs;
  for (auto& [step, dir] : step_dirs(root, false)) dirs.push_back(std::move(dir));
  return dirs;
}

namespace {

constexpr const char* kSurvivorsSuffix = ".survivors.";

std::string base_file(const std::string& dir, int rank) {
  return fmt::format("{}/rank-{:05d}.base.json", dir, rank);
}

// A shard's place in its tensor: two ranks holding the same place hold the same values.
auto place_of(const ShardInfo& s) {
  return std::tuple(s.name, s.shard_dim, s.shard_start, s.shard_dim2, s.shard_start2, s.row_start,
                    s.local_shape.dims);
}

// The survivors' directory `dir` of `step` made the committed checkpoint of its step, if its
// complete files hold every tensor; otherwise why not. `newest`: root's newest committed
// checkpoint ("" if none).
std::string adopt(const std::string& root, const std::string& dir, int64_t step,
                  const std::string& newest) {
  std::optional<Manifest> base;
  std::vector<Manifest::Entry> entries;
  std::set<decltype(place_of(ShardInfo{}))> seen;
  int ranks = 0;
  for (const fs::directory_entry& f : fs::directory_iterator(dir)) {
    const std::string name = f.path().filename().string();
    int rank = -1;
    if (std::sscanf(name.c_str(), "rank-%d.base.json", &rank) != 1 || !name.ends_with(".base.json"))
      continue;
    const std::string h5 = dir + "/" + rank_file_name(rank);
    if (!fs::is_regular_file(h5)) continue;
    Manifest mine = parse_manifest(f.path().string());
    ++ranks;
    for (Manifest::Entry& e : mine.shards)
      if (seen.insert(place_of(e.shard)).second) entries.push_back(std::move(e));
    mine.shards.clear();
    if (!base || (base->tokenizer_file.empty() && !mine.tokenizer_file.empty())) base = mine;
  }
  if (!base) return "no rank finished its file";
  std::map<std::string, Shape> have;
  for (const Manifest::Entry& e : entries) have.emplace(e.shard.name, e.shard.global_shape);
  if (int64_t(have.size()) != base->tensors)
    return fmt::format("the {} ranks' files hold {} tensors of {} (their only holders are gone)",
                       ranks, have.size(), base->tensors);
  std::optional<Manifest> committed;
  if (!newest.empty()) committed = parse_manifest(newest + "/manifest.json");
  if (committed)
    for (const Manifest::Entry& e : committed->shards) {
      auto it = have.find(e.shard.name);
      if (it == have.end() || !(it->second == e.shard.global_shape))
        return fmt::format("{} differs from {}'s", e.shard.name, newest);
    }
  try {
    check_coverage(dir, entries);
  } catch (const Error& e) {
    return fmt::format("the {} ranks' files do not hold everything: {}", ranks, e.what());
  }
  Manifest manifest = *base;
  manifest.step = step;
  manifest.tensors = -1;
  manifest.checksum = checksum_name(kWrittenChecksum);
  manifest.shards = std::move(entries);
  const bool carried =
      !manifest.tokenizer_file.empty() && fs::is_regular_file(dir + "/" + manifest.tokenizer_file);
  if (!carried && committed && !committed->tokenizer_file.empty()) {
    manifest.tokenizer_file = committed->tokenizer_file;
    manifest.tokenizer_sha256 = committed->tokenizer_sha256;
    fs::copy_file(carried_tokenizer(newest, *committed), dir + "/" + manifest.tokenizer_file,
                  fs::copy_options::overwrite_existing);
  } else if (!carried) {
    manifest.tokenizer_file.clear();  // rank 0, which held its bytes, wrote none
    manifest.tokenizer_sha256.clear();
  }
  if (!manifest.tokenizer_file.empty()) {
    const std::string path = dir + "/" + manifest.tokenizer_file;
    if (sha256_hex(read_text(path)) != manifest.tokenizer_sha256)
      return path + " differs from the sha256 its base names";
    sync_path(path, false);
  }
  write_atomically(dir + "/manifest.json", manifest_json(manifest));
  sync_path(dir, true);
  const std::string final_dir = checkpoint_dir(root, step);
  if (fs::exists(final_dir)) return final_dir + " exists";
  rename_or_fail(dir, final_dir);
  sync_path(root, true);
  return "";
}

}  // namespace

std::string survivors_dir(const std::string& root, int64_t step, const std::string& tag) {
  return checkpoint_dir(root, step) + kSurvivorsSuffix + tag;
}

void write_survivor(const std::string& root, int rank, const std::string& tag, const Manifest& base,
                    const std::vector<ShardData>& shards, std::string_view tokenizer) {
  const std::string dir = survivors_dir(root, base.step, tag);
  const std::string file = dir + "/" + rank_file_name(rank);
  write_rank_file(file, shards, /*direct_io=*/false, false);
  if (!base.tokenizer_file.empty() && !tokenizer.empty())
    write_atomically(dir + "/" + base.tokenizer_file, std::string(tokenizer));
  Manifest mine = base;
  mine.checksum = checksum_name(kWrittenChecksum);
  mine.shards = parse_sidecar(file + ".json");
  write_atomically(base_file(dir, rank), manifest_json(mine));
  sync_path(dir, true);
}

std::vector<std::string> adopt_survivors(const std::string& root, int64_t logged_step) {
  static const std::regex pattern(R"(step-(\d{1,18})\.survivors\..+)");
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const fs::directory_entry& d : fs::directory_iterator(root, ec)) {
    std::smatch m;
    const std::string name = d.path().filename().string();
    if (d.is_directory(ec) && std::regex_match(name, m, pattern))
      found.emplace_back(std::stoll(m[1].str()), d.path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a > b; });
  std::vector<std::string> said;
  const std::vector<std::pair<int64_t, std::string>> committed = step_dirs(root, true);
  for (const auto& [step, dir] : found) {
    const int64_t newest = committed.empty() ? -1 : committed.front().first;
    if (step <= newest) {
      fs::remove_all(dir, ec);  // what it holds, a committed checkpoint holds as new
      continue;
    }
    std::string why;
    if (logged_step >= 0 && step > logged_step) {
      why = fmt::format("the run's log ends at step {}: step {}'s loss was not logged", logged_step,
                        step);
    } else {
      try {
        why = adopt(root, dir, step, newest < 0 ? std::string() : committed.front().second);
      } catch (const Error& e) {
        why = e.what();
      }
    }
    if (why.empty()) {
      said.push_back(
          fmt::format("the survivors' state of step {} adopted as {} (the newest "
                      "before it: {})",
                      step, checkpoint_dir(root, step),
                      newest < 0 ? std::string("none") : committed.front().second));
      // Older survivors' directories: no newer than what was adopted.
      for (const auto& [older, other] : found)
        if (older <= step && other != dir) fs::remove_all(other, ec);
      return said;
    }
    said.push_back(fmt::format("{}: not adopted: {}", dir, why));
  }
  return said;
}

}  // namespace pentad::ckpt
