#pragma once
// manifest.json and the per-rank sidecars (<rank file>.json) as text. Both name their
// checksum algorithm ("checksum": "xxh3-64") and list shards in the same form: {file,
// name, global_shape, shard_dim, shard_start, local_shape, checksum (16 hex digits)}.
// Format version 1 (no algorithm; "crc32": zlib's crc32 as an integer) is still read.
// Parsing validates everything a reader relies on and throws pentad::Error naming the
// file. Internal to checkpoint/.
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace pentad::ckpt {

std::string sidecar_json(const std::vector<Manifest::Entry>& shards);
std::vector<Manifest::Entry> parse_sidecar(const std::string& path);

std::string manifest_json(const Manifest& manifest);
// shards_required = false takes a manifest that lists none (an in-memory level's index of
// a rank that holds no shard).
Manifest parse_manifest(const std::string& path, bool shards_required = true);

// Throws pentad::Error naming `path` if the file cannot be read.
std::string read_text(const std::string& path);

}  // namespace pentad::ckpt
