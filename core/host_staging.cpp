// HostStaging's bookkeeping (core/device_memory.h), the same whether the device-memory
// backend is CUDA's or none: which free block a request takes, a new block's size, which
// block an address lies in, and what is held. The copies and the blocks' memory are the
// backend's.
#include <algorithm>

#include "core/check.h"
#include "core/device_memory.h"

namespace pentad {

HostStaging::Block* HostStaging::smallest_free(size_t bytes, bool pinned) {
  Block* best = nullptr;
  for (Block& b : blocks_)
    if (!b.in_use && b.bytes >= bytes && (b.pinned || !pinned) && (!best || b.bytes < best->bytes))
      best = &b;
  return best;
}

size_t HostStaging::new_block_bytes(size_t bytes) {
  return std::max<size_t>((bytes + 4095) / 4096 * 4096, size_t{64} << 10);
}

HostStaging::Block& HostStaging::block_of(const void* at, size_t bytes) {
  const char* p = static_cast<const char*>(at);
  for (Block& b : blocks_)
    if (b.in_use && p >= b.host && p + bytes <= b.host + b.bytes) return b;
  fail("HostStaging: {} bytes at {} are not inside an acquired block", bytes, at);
}

size_t HostStaging::held_bytes() const {
  size_t total = 0;
  for (const Block& b : blocks_) total += b.bytes;
  return total;
}

}  // namespace pentad
