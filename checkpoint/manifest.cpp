#include "checkpoint/manifest.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "checkpoint/checksum.h"
#include "core/check.h"

namespace pentad::ckpt {

using nlohmann::json;

namespace {

// Version 2: xxh3-64 checksums as hex strings, the algorithm named once. Version 1
// (crc32 integers) is still read.
constexpr int kFormatVersion = 2;

json shape_json(const Shape& shape) {
  json dims = json::array();
  for (int d = 0; d < shape.ndim; ++d) dims.push_back(shape[d]);
  return dims;
}

json entry_json(const Manifest::Entry& e) {
  const ShardInfo& s = e.shard;
  json j{{"file", e.file},
         {"name", s.name},
         {"global_shape", shape_json(s.global_shape)},
         {"shard_dim", s.shard_dim},
         {"shard_start", s.shard_start},
         {"local_shape", shape_json(s.local_shape)},
         {"checksum", fmt::format("{:016x}", s.checksum)}};
  if (s.row_start != 0) j["row_start"] = s.row_start;  // ZeRO shares only
  if (s.shard_dim2 >= 0) {                             // 2D tensor-parallel blocks only
    j["shard_dim2"] = s.shard_dim2;
    j["shard_start2"] = s.shard_start2;
  }
  return j;
}

// Parse errors are Error("<what>") here; the callers prefix the file.
int64_t integer(const json& j, const char* key) {
  const json& v = j.at(key);
  if (!v.is_number_integer()) fail("'{}' is not an integer", key);
  return v.get<int64_t>();
}

Shape shape_from(const json& j, const char* key) {
  const json& v = j.at(key);
  if (!v.is_array() || v.size() > static_cast<size_t>(kMaxDims))
    fail("'{}' is not an array of at most {} dims", key, kMaxDims);
  Shape shape;
  for (const json& d : v) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      fail("'{}' holds something other than a size", key);
    shape.dims[static_cast<size_t>(shape.ndim++)] = d.get<int64_t>();
  }
  return shape;
}

uint64_t hex64(const json& j, const char* key) {
  const json& v = j.at(key);
  const std::string text = v.is_string() ? v.get<std::string>() : "";
  if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos)
    fail("'{}' is not 16 lowercase hex digits", key);
  return std::stoull(text, nullptr, 16);
}

// version: the file's format version (1: crc32 integers; 2: hex checksums).
Manifest::Entry entry_from(const json& j, int version) {
  Manifest::Entry e;
  e.file = j.at("file").get<std::string>();
  if (e.file.empty() || e.file == "." || e.file == ".." || e.file.find('/') != std::string::npos)
    fail("file '{}' is not a file name inside the checkpoint directory", e.file);
  ShardInfo& s = e.shard;
  s.name = j.at("name").get<std::string>();
  if (s.name.empty()) fail("a shard has an empty name");
  s.global_shape = shape_from(j, "global_shape");
  s.local_shape = shape_from(j, "local_shape");
  s.shard_dim = static_cast<int>(integer(j, "shard_dim"));
  s.shard_start = integer(j, "shard_start");
  s.row_start = j.contains("row_start") ? integer(j, "row_start") : 0;
  s.shard_dim2 = j.contains("shard_dim2") ? static_cast<int>(integer(j, "shard_dim2")) : -1;
  s.shard_start2 = j.contains("shard_start2") ? integer(j, "shard_start2") : 0;
  if (version == 1) {
    const int64_t crc = integer(j, "crc32");
    if (crc < 0 || crc > 0xffffffffLL) fail("tensor {}: crc32 {} is not 32-bit", s.name, crc);
    s.checksum = static_cast<uint64_t>(crc);
  } else {
    s.checksum = hex64(j, "checksum");
  }

  // The shard must be a slice of its global tensor along shard_dim (or all of it), or rows of
  // such a slice along dim 0 (a ZeRO share).
  const int ndim = s.global_shape.ndim;
  bool ok = s.local_shape.ndim == ndim && s.shard_dim >= -1 && s.shard_dim < ndim &&
            s.shard_start >= 0 && (s.shard_dim >= 0 || s.shard_start == 0) && s.row_start >= 0 &&
            s.shard_dim2 >= -1 && s.shard_dim2 < ndim && s.shard_start2 >= 0 &&
            (s.shard_dim2 >= 0 || s.shard_start2 == 0) &&
            (s.shard_dim2 < 0 || (s.shard_dim >= 0 && s.shard_dim2 != s.shard_dim));
  for (int d = 0; ok && d < ndim; ++d) {
    const int64_t start = (d == s.shard_dim ? s.shard_start : 0) +
                          (d == s.shard_dim2 ? s.shard_start2 : 0) + (d == 0 ? s.row_start : 0);
    ok = d == s.shard_dim || d == s.shard_dim2 || d == 0
             ? start + s.local_shape[d] <= s.global_shape[d]
             : s.local_shape[d] == s.global_shape[d];
  }
  if (!ok)
    fail("tensor {}: local shape {} at {} along dim {} is not a slice of global shape {}", s.name,
         s.local_shape.str(), s.shard_start, s.shard_dim, s.global_shape.str());
  return e;
}

std::vector<Manifest::Entry> entries_from(const json& shards, int version) {
  if (!shards.is_array()) fail("'shards' is not an array");
  std::vector<Manifest::Entry> entries;
  entries.reserve(shards.size());
  std::map<std::string, size_t> first;  // tensor name -> index of its first shard
  for (const json& j : shards) {
    entries.push_back(entry_from(j, version));
    const Manifest::Entry& e = entries.back();
    auto [it, inserted] = first.emplace(e.shard.name, entries.size() - 1);
    const Manifest::Entry& f = entries[it->second];
    if (!inserted && !(f.shard.global_shape == e.shard.global_shape))
      fail("tensor {} has global shape {} in {} but {} in {}", e.shard.name,
           f.shard.global_shape.str(), f.file, e.shard.global_shape.str(), e.file);
  }
  return entries;
}

json parse_json(const std::string& path) {
  try {
    return json::parse(read_text(path));
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
}

// The format version of a manifest or sidecar (1 when absent) and its checksum algorithm;
// throws if this pentad cannot check them.
int version_of(const json& j, std::string& checksum) {
  const int64_t version = j.contains("version") ? integer(j, "version") : 1;
  if (version < 1 || version > kFormatVersion)
    fail("format version {} (this pentad reads versions 1 to {})", version, kFormatVersion);
  checksum = version == 1 ? "crc32" : j.at("checksum").get<std::string>();
  if (!checksum_kind(checksum))
    fail("checksum algorithm '{}' is not one this pentad knows (crc32, xxh3-64)", checksum);
  return static_cast<int>(version);
}

}  // namespace

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open it: {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail("{}: cannot read it", path);
  return text.str();
}

std::string sidecar_json(const std::vector<Manifest::Entry>& shards) {
  json list = json::array();
  for (const Manifest::Entry& e : shards) list.push_back(entry_json(e));
  return json{{"version", kFormatVersion},
              {"checksum", checksum_name(kWrittenChecksum)},
              {"shards", std::move(list)}}
             .dump(1) +
         "\n";
}

std::vector<Manifest::Entry> parse_sidecar(const std::string& path) {
  const json j = parse_json(path);
  try {
    std::string checksum;
    const int version = version_of(j, checksum);
    if (checksum != checksum_name(kWrittenChecksum))
      fail("checksums are {}, not {} (written by another pentad?)", checksum,
           checksum_name(kWrittenChecksum));
    return entries_from(j.at("shards"), version);
  } catch (const json::exception& e) {
    fail("{}: malformed sidecar: {}", path, e.what());
  } catch (const Error& e) {
    fail("{}: malformed sidecar: {}", path, e.what());
  }
}

std::string manifest_json(const Manifest& m) {
  json files = json::array(), shards = json::array();
  std::set<std::string> seen;
  for (const Manifest::Entry& e : m.shards) {
    if (seen.insert(e.file).second) files.push_back(e.file);
    shards.push_back(entry_json(e));
  }
  const Layout& l = m.layout;
  json layout{{"world", l.world}, {"tp", l.tp}, {"dp", l.dp},
              {"pp", l.pp},       {"cp", l.cp}, {"sequence_parallel", l.sequence_parallel}};
  json j{{"format", "pentad-checkpoint"},
         {"version", kFormatVersion},
         {"checksum", m.checksum},
         {"step", m.step},
         {"optimizer_steps", m.optimizer_steps},
         {"layout", std::move(layout)},
         {"recipe", m.recipe_toml},
         {"files", std::move(files)},
         {"shards", std::move(shards)}};
  if (m.samples >= 0) j["samples"] = m.samples;
  if (m.tensors >= 0) j["tensors"] = m.tensors;
  if (!m.tokenizer_file.empty())
    j["tokenizer"] = {{"file", m.tokenizer_file}, {"sha256", m.tokenizer_sha256}};
  return j.dump(1) + "\n";
}

Manifest parse_manifest(const std::string& path, bool shards_required) {
  const json j = parse_json(path);
  try {
    if (!j.is_object()) fail("not a JSON object");
    Manifest m;
    const int version = version_of(j, m.checksum);
    m.step = integer(j, "step");
    m.optimizer_steps = integer(j, "optimizer_steps");
    if (m.step < 0 || m.optimizer_steps < 0) fail("negative step");
    m.samples = j.contains("samples") ? integer(j, "samples") : -1;
    if (j.contains("samples") && m.samples < 0) fail("negative samples");
    m.tensors = j.contains("tensors") ? integer(j, "tensors") : -1;
    const json& l = j.at("layout");
    m.layout.world = static_cast<int>(integer(l, "world"));
    m.layout.tp = static_cast<int>(integer(l, "tp"));
    m.layout.dp = static_cast<int>(integer(l, "dp"));
    m.layout.pp = static_cast<int>(integer(l, "pp"));
    m.layout.cp = static_cast<int>(integer(l, "cp"));
    m.layout.sequence_parallel = l.at("sequence_parallel").get<bool>();
    m.recipe_toml = j.at("recipe").get<std::string>();
    if (j.contains("tokenizer")) {
      const json& t = j.at("tokenizer");
      m.tokenizer_file = t.at("file").get<std::string>();
      m.tokenizer_sha256 = t.at("sha256").get<std::string>();
      if (std::find(std::begin(kTokenizerFiles), std::end(kTokenizerFiles), m.tokenizer_file) ==
          std::end(kTokenizerFiles))
        fail("tokenizer file \"{}\" is not tokenizer.json or tokenizer.model", m.tokenizer_file);
      if (m.tokenizer_sha256.size() != 64 ||
          m.tokenizer_sha256.find_first_not_of("0123456789abcdef") != std::string::npos)
        fail("tokenizer sha256 \"{}\" is not 64 hex digits", m.tokenizer_sha256);
    }
    m.shards = entries_from(j.at("shards"), version);
    if (m.shards.empty() && shards_required) fail("no shards");
    return m;
  } catch (const json::exception& e) {
    fail("{}: malformed manifest: {}", path, e.what());
  } catch (const Error& e) {
    fail("{}: malformed manifest: {}", path, e.what());
  }
}

}  // namespace pentad::ckpt
