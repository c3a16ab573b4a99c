// HostStaging's bookkeeping (core/device_memory.h), the same whether the device-memory
// backend is CUDA's or none: which free block a request takes, a new block's size, which
// block an address lies in, and what is held. The copies and the blocks' memory are the
// backend's.
#include <algorithm>
#include <cstdint>
#include <string>

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

bool HostStaging::holds(const void* block, size_t block_bytes, const void* at, size_t bytes) {
  const auto start = reinterpret_cast<uintptr_t>(block), p = reinterpret_cast<uintptr_t>(at);
  return p >= start && p - start < block_bytes && bytes <= block_bytes - (p - start);
}

HostStaging::Block& HostStaging::block_of(const void* at, size_t bytes) {
  for (Block& b : blocks_)
    if (b.in_use && holds(b.host, b.bytes, at, bytes)) return b;
  // Say which mistake it is: a block given back already, a span past a block's end, or
  // memory this staging never held (a communicator gone before its operations).
  std::string why = fmt::format("in none of the {} blocks this staging holds", blocks_.size());
  for (const Block& b : blocks_)
    if (holds(b.host, b.bytes, at, 1))
      why = b.in_use ? fmt::format("past the end of its block of {} bytes", b.bytes)
                     : std::string("in a block already given back");
  fail("HostStaging: {} bytes at {} are not inside an acquired block ({})", bytes, at, why);
}

HostStaging::Block& HostStaging::acquired(const void* block) {
  for (Block& b : blocks_)
    if (b.host == block) {
      if (!b.in_use) fail("HostStaging: the block at {} is given back twice", block);
      return b;
    }
  fail("HostStaging: {} is no block of this staging (a communicator gone before its operations?)",
       block);
}

size_t HostStaging::held_bytes() const {
  size_t total = 0;
  for (const Block& b : blocks_) total += b.bytes;
  return total;
}

}  // namespace pentad
