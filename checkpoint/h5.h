#pragma once
// The HDF5 side of checkpoints, kept behind this small interface so that only h5.cpp sees
// HDF5's headers. A rank file holds one f32 dataset per shard, contiguous and uncompressed,
// at the path of the tensor's name (groups for each '/'), with attributes global_shape,
// shard_dim, shard_start and crc32. HDF5 never prints: every failure becomes a
// pentad::Error naming the file (and the tensor). Internal to checkpoint/.
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/box.h"
#include "checkpoint/checkpoint.h"

namespace pentad::ckpt::h5 {

// Writes a new file at `path` (truncating any) with every shard and returns each shard's
// crc32 (computed just before the shard is written, so the checksum of one overlaps the
// kernel's writeback of the previous). Does not fsync. Errors name `shown_path`.
std::vector<uint32_t> write_file(const std::string& path, const std::string& shown_path,
                                 const std::vector<ShardData>& shards);

// One rank file opened read-only. Not thread-safe (neither is serial HDF5).
class File {
 public:
  explicit File(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Reads the whole dataset `name`, whose dims must be `shape`, into dst.
  void read(const std::string& name, const Shape& shape, float* dst);
  // Reads `region` (global coordinates) of the dataset holding `stored` (global
  // coordinates) into dst, a row-major buffer holding `dst_box`.
  void read_region(const std::string& name, const Box& stored, const Box& region, float* dst,
                   const Box& dst_box);

  const std::string& path() const { return path_; }

 private:
  int64_t open_dataset(const std::string& name, const Box& stored);  // checks dims and type

  std::string path_;
  int64_t id_ = -1;  // hid_t
};

// Byte offset of a dataset's data inside the file (tests use it to corrupt one tensor).
int64_t data_offset(const std::string& path, const std::string& name);

}  // namespace pentad::ckpt::h5
