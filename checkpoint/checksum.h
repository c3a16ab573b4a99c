#pragma once
// Checksums of shard bytes. A manifest names its algorithm once ("checksum"), and every
// shard entry carries the value:
//   "xxh3-64" (format version 2, what pentad writes): XXH3_64bits of the shard's bytes,
//             seed 0, as `xxhsum -H3` prints it. About ten times zlib's crc32 a core, so
//             the saver can fold it into its copy.
//   "crc32"   (format version 1, still read): zlib's crc32 of the shard's bytes.
// Internal to checkpoint/.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pentad::ckpt {

enum class ChecksumKind { Crc32, Xxh3_64 };

constexpr ChecksumKind kWrittenChecksum = ChecksumKind::Xxh3_64;

const char* checksum_name(ChecksumKind kind);
std::optional<ChecksumKind> checksum_kind(const std::string& name);  // nullopt if unknown

// The checksum of `bytes` bytes at data. parallel: split crc32 across the OpenMP threads
// and combine (loading runs alone); xxh3-64 is serial (it runs near memory bandwidth).
uint64_t checksum_of(ChecksumKind kind, const void* data, size_t bytes, bool parallel = false);

// xxh3-64 of each of `spans` (data, bytes), on up to `threads` threads of its own, the
// largest first: a whole snapshot's tensors at the cores' rate rather than one core's.
std::vector<uint64_t> xxh3_each(const std::vector<std::pair<const void*, size_t>>& spans,
                                int threads);

// xxh3-64 of a byte stream fed in pieces: equal to checksum_of() of the concatenation.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;

  void reset();
  void update(const void* data, size_t bytes);
  uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace pentad::ckpt
