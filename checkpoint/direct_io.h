#pragma once
// Writing shard bytes where HDF5 laid out their datasets: byte ranges at file offsets, then
// fsync. Internal to checkpoint/.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pentad::ckpt {

struct Extent {
  int64_t offset = 0;  // in the file
  const void* data = nullptr;
  size_t bytes = 0;
};

// Writes every extent into the existing file `path`, then fsyncs it. With direct, the
// whole pages of an extent whose file offset and address both start a page go through
// O_DIRECT: the device reads the caller's memory, with no copy into the page cache (most
// of a buffered write's CPU cost) and no dirty pages left to flush. The rest, and
// everything on a file system that refuses O_DIRECT (tmpfs), is written buffered. Errors
// name shown_path.
void write_extents(const std::string& path, const std::string& shown_path,
                   const std::vector<Extent>& extents, bool direct);

}  // namespace pentad::ckpt
