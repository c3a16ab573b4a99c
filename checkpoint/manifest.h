#pragma once
// manifest.json and the per-rank sidecars (<rank file>.json) as text. Both list shards in
// the same form: {file, name, global_shape, shard_dim, shard_start, local_shape, crc32}.
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
Manifest parse_manifest(const std::string& path);

// zlib's crc32 of count floats' bytes: the checksum manifests list for each shard.
// parallel: split across the OpenMP threads and combined (loading runs alone; the
// asynchronous writer shares the cores with training and stays serial).
uint32_t crc32_of(const float* data, int64_t count, bool parallel = false);

// Throws pentad::Error naming `path` if the file cannot be read.
std::string read_text(const std::string& path);

}  // namespace pentad::ckpt
