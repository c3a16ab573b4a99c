// Reading a checkpoint in any layout: every requested slice is assembled from whichever
// stored shards overlap it, and every stored shard is checksummed the first time it is
// touched. Also `pentad ckpt inspect`.
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string_view>

#include "checkpoint/box.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checksum.h"
#include "checkpoint/h5.h"
#include "checkpoint/manifest.h"
#include "core/check.h"
#include "core/progress.h"

namespace pentad::ckpt {

namespace fs = std::filesystem;

namespace {

Box box_of(const ShardInfo& s) {
  return shard_box(s.global_shape, s.shard_dim, s.shard_start, s.local_shape, s.row_start,
                   s.shard_dim2, s.shard_start2);
}

constexpr size_t kKeepScratchBytes = 256u << 20;  // larger scratch is freed after each read

}  // namespace

struct Reader::Impl {
  std::map<std::string, std::vector<size_t>> shards_of;    // tensor -> indices into shards
  std::map<std::string, std::unique_ptr<h5::File>> files;  // opened on first use
  std::vector<bool> verified;                              // per shard
  std::vector<float> scratch;                              // one stored shard
  ChecksumKind checksum = kWrittenChecksum;                // the manifest's algorithm

  // Throws naming the file and the tensor when the shard's bytes do not match.
  void verify(const h5::File& file, const ShardInfo& shard, const float* data) const {
    const uint64_t computed = checksum_of(
        checksum, data, static_cast<size_t>(shard.local_shape.numel()) * sizeof(float), true);
    if (computed != shard.checksum)
      fail(
          "{}: tensor {}: {} checksum mismatch (stored {:016x}, computed {:016x}): the file is "
          "corrupt",
          file.path(), shard.name, checksum_name(checksum), shard.checksum, computed);
  }

  h5::File& file(const std::string& dir, const std::string& name) {
    auto it = files.find(name);
    if (it != files.end()) return *it->second;
    const std::string path = dir + "/" + name;
    if (!fs::exists(path)) fail("{}: missing (the manifest lists it)", path);
    return *files.emplace(name, std::make_unique<h5::File>(path)).first->second;
  }
};

Reader::Reader(const std::string& dir)
    : dir_(dir), manifest_(parse_manifest(dir + "/manifest.json")), impl_(new Impl) {
  for (size_t i = 0; i < manifest_.shards.size(); ++i)
    impl_->shards_of[manifest_.shards[i].shard.name].push_back(i);
  impl_->verified.assign(manifest_.shards.size(), false);
  impl_->checksum = *checksum_kind(manifest_.checksum);  // parse_manifest checked it
}

Reader::~Reader() {
  delete impl_;
}

bool Reader::has(const std::string& name) const {
  return impl_->shards_of.count(name) > 0;
}

std::vector<std::string> Reader::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, shards] : impl_->shards_of) names.push_back(name);
  return names;
}

Shape Reader::global_shape(const std::string& name) const {
  auto it = impl_->shards_of.find(name);
  if (it == impl_->shards_of.end()) fail("checkpoint {} has no tensor {}", dir_, name);
  return manifest_.shards[it->second.front()].shard.global_shape;
}

void Reader::read(const std::string& name, const Shape& global_shape, int shard_dim,
                  int64_t shard_start, const Shape& local_shape, float* out, int64_t row_start,
                  int shard_dim2, int64_t shard_start2) {
  const Shape stored_shape = this->global_shape(name);
  if (!(stored_shape == global_shape))
    fail("checkpoint {}: tensor {} has global shape {}, but the model needs {}", dir_, name,
         stored_shape.str(), global_shape.str());
  const Box want = shard_box(global_shape, shard_dim, shard_start, local_shape, row_start,
                             shard_dim2, shard_start2);
  PENTAD_CHECK(
      local_shape.ndim == global_shape.ndim && shard_dim >= -1 && shard_dim < global_shape.ndim &&
          intersect(want, whole_box(global_shape)) == want && want.numel() == local_shape.numel(),
      "{}: local {} at {} along dim {} is not a slice of {}", name, local_shape.str(), shard_start,
      shard_dim, global_shape.str());
  if (want.numel() == 0) return;

  // Plan: stored shards by decreasing overlap, each only if it covers something new
  // (replicas of one shard are read once).
  std::vector<size_t> candidates = impl_->shards_of.at(name);
  auto overlap = [&](size_t i) { return intersect(box_of(manifest_.shards[i].shard), want); };
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](size_t a, size_t b) { return overlap(a).numel() > overlap(b).numel(); });
  std::vector<Box> missing = {want};
  std::vector<size_t> plan;
  for (size_t i : candidates) {
    std::vector<Box> left;
    for (const Box& m : missing)
      for (const Box& part : subtract(m, box_of(manifest_.shards[i].shard))) left.push_back(part);
    auto numel = [](const std::vector<Box>& boxes) {
      int64_t n = 0;
      for (const Box& b : boxes) n += b.numel();
      return n;
    };
    if (numel(left) < numel(missing)) plan.push_back(i);
    missing = std::move(left);
  }
  if (!missing.empty())
    fail("checkpoint {} does not cover {} {}", dir_, name,
         describe_gap(missing.front(), global_shape));

  for (size_t i : plan) {
    const Manifest::Entry& entry = manifest_.shards[i];
    const Box stored = box_of(entry.shard);
    const Box region = intersect(stored, want);
    h5::File& file = impl_->file(dir_, entry.file);
    if (impl_->verified[i]) {  // only the overlap, straight into place
      file.read_region(name, stored, region, out, want);
      continue;
    }
    // First touch: the whole shard, for its checksum. Straight into `out` when it lands
    // there as one contiguous run (the same layout, or a split along dim 0).
    const Box in_want = relative_to(region, want);
    const bool direct = region == stored && contiguous_in(in_want, want);
    if (!direct) impl_->scratch.resize(static_cast<size_t>(stored.numel()));
    float* whole = direct ? out + offset_in(in_want, want) : impl_->scratch.data();
    file.read(name, entry.shard.local_shape, whole);
    impl_->verify(file, entry.shard, whole);
    impl_->verified[i] = true;
    if (!direct) copy_region(whole, stored, out, want, region);
  }
  if (impl_->scratch.capacity() * sizeof(float) > kKeepScratchBytes)
    std::vector<float>().swap(impl_->scratch);
}

int64_t Reader::verify_all() {
  int64_t total_bytes = 0;  // float32 shards: the ETA's denominator
  for (const auto& entry : manifest_.shards)
    total_bytes += entry.shard.local_shape.numel() * static_cast<int64_t>(sizeof(float));
  Progress progress("verify", total_bytes);
  int64_t bytes_read = 0;
  for (size_t i = 0; i < manifest_.shards.size(); ++i) {
    if (progress.due())
      progress.show(bytes_read, fmt::format("{}/{} shards", i, manifest_.shards.size()));
    if (impl_->verified[i]) continue;
    const ShardInfo& s = manifest_.shards[i].shard;
    h5::File& file = impl_->file(dir_, manifest_.shards[i].file);
    impl_->scratch.resize(static_cast<size_t>(s.local_shape.numel()));
    file.read(s.name, s.local_shape, impl_->scratch.data());
    impl_->verify(file, s, impl_->scratch.data());
    impl_->verified[i] = true;
    bytes_read += static_cast<int64_t>(impl_->scratch.size() * sizeof(float));
  }
  progress.finish();
  std::vector<float>().swap(impl_->scratch);
  return static_cast<int64_t>(manifest_.shards.size());
}

std::string inspect(const std::string& dir, bool verify) {
  Reader reader(dir);
  const Manifest& m = reader.manifest();
  const Layout& l = m.layout;
  std::string text = fmt::format("checkpoint {}\n", dir);
  text += fmt::format("  step {}, optimizer steps {}, {} checksums\n", m.step, m.optimizer_steps,
                      m.checksum);
  text += fmt::format("  layout: world {} = tp {} x dp {} x pp {} x cp {}, sequence parallel {}\n",
                      l.world, l.tp, l.dp, l.pp, l.cp, l.sequence_parallel ? "on" : "off");
  // The whole recipe, indented (still valid TOML): what the tensors mean, and the keys to
  // train on from here. `--recipe` prints it alone.
  text += "  recipe (TOML):\n";
  for (size_t at = 0; at < m.recipe_toml.size();) {
    size_t end = m.recipe_toml.find('\n', at);
    if (end == std::string::npos) end = m.recipe_toml.size();
    const std::string_view line(m.recipe_toml.data() + at, end - at);
    text += line.empty() ? std::string("\n") : fmt::format("    {}\n", line);
    at = end + 1;
  }

  std::set<std::string> seen;
  text += "  files:\n";
  for (const Manifest::Entry& e : m.shards) {
    if (!seen.insert(e.file).second) continue;
    std::error_code ec;
    const auto bytes = fs::file_size(dir + "/" + e.file, ec);
    text += fmt::format("    {}  {}\n", e.file, ec ? "MISSING" : format_bytes(bytes));
  }
  if (!m.tokenizer_file.empty()) {
    // --verify checks the copy's bytes against the recorded hash, as generate and convert do.
    if (verify) carried_tokenizer(dir, m);
    text += fmt::format("    {}  tokenizer, sha256 {}{}\n", m.tokenizer_file, m.tokenizer_sha256,
                        verify ? " (verified)" : "");
  }

  struct Row {
    Shape shape;
    int64_t shards = 0, bytes = 0;
    std::set<int> dims;
  };
  std::map<std::string, Row> rows;
  size_t width = 0;
  int64_t total = 0;
  for (const Manifest::Entry& e : m.shards) {
    Row& r = rows[e.shard.name];
    r.shape = e.shard.global_shape;
    ++r.shards;
    r.bytes += e.shard.local_shape.numel() * static_cast<int64_t>(sizeof(float));
    if (e.shard.shard_dim >= 0) r.dims.insert(e.shard.shard_dim);
    if (e.shard.shard_dim2 >= 0) r.dims.insert(e.shard.shard_dim2);
    width = std::max(width, e.shard.name.size());
    total += e.shard.local_shape.numel() * static_cast<int64_t>(sizeof(float));
  }
  text += fmt::format("  tensors ({}, {} shards):\n", rows.size(), m.shards.size());
  for (const auto& [name, r] : rows) {
    std::string split = "whole";
    for (int d : r.dims)
      split = (split == "whole" ? "split along dim " : split + ",") + std::to_string(d);
    text += fmt::format("    {:<{}}  {:<16}  {:>3} shard{}  {:<18}  {}\n", name, width,
                        r.shape.str(), r.shards, r.shards == 1 ? " " : "s", split,
                        format_bytes(static_cast<size_t>(r.bytes)));
  }
  text += fmt::format("  total {} ({} bytes)\n", format_bytes(static_cast<size_t>(total)), total);
  if (verify) text += fmt::format("  all {} shards verified\n", reader.verify_all());
  return text;
}

}  // namespace pentad::ckpt
