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

// Makes the existing file `target` (a recycled one, holding old bytes) equal to the file
// `layout` everywhere outside `extents`: copies layout's bytes there (HDF5's metadata, and
// the zeros of its holes) and gives target layout's size. Once write_extents() has filled
// the extents, target is byte for byte the file the same write into `layout` would give,
// written over blocks the file system already allocated. Errors name shown_path.
void overlay_layout(const std::string& layout, const std::string& target,
                    const std::string& shown_path, std::vector<Extent> extents);

}  // namespace pentad::ckpt
