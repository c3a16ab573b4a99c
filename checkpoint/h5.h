#pragma once
// The HDF5 side of checkpoints, kept behind this small interface so that only h5.cpp sees
// HDF5's headers. A rank file holds one f32 dataset per shard, contiguous and uncompressed,
// at the path of the tensor's name (groups for each '/'), with attributes global_shape,
// shard_dim, shard_start and the checksum (named after its algorithm: "xxh3-64"; "crc32"
// in version 1 files). HDF5 never prints: every failure becomes a pentad::Error naming the
// file (and the tensor). Internal to checkpoint/.
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/box.h"
#include "checkpoint/checkpoint.h"

namespace pentad::ckpt::h5 {

// Creates a new file at `path` (truncating any) holding every shard's dataset, its space
// allocated and its attributes (info.checksum included) written, but not its data: HDF5
// writes only the metadata. Returns each dataset's byte offset in the file (-1 for an
// empty shard), where the caller writes the shard's bytes; datasets of 64 KiB and more
// start on a 4 KiB boundary (direct I/O). Does not fsync. Errors name `shown_path`.
std::vector<int64_t> create_file(const std::string& path, const std::string& shown_path,
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
