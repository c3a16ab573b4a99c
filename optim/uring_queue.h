#pragma once
// Reads and writes of one file through io_uring, kept going by a thread of their own so that
// they progress while the caller computes (the transfers behind optim/nvme_state's pipeline).
// Internal to optim/.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pentad {

enum class IoDir { read = 0, write = 1 };

struct IoSpan {
  int64_t offset = 0;    // in the file; a multiple of 4096 under O_DIRECT
  char* data = nullptr;  // 4096-aligned under O_DIRECT
  size_t bytes = 0;      // a multiple of 4096 under O_DIRECT
};

class UringQueue {
 public:
  using Ticket = uint64_t;
  // Cuts every span into requests of at most block_bytes and keeps up to queue_depth of them
  // in flight per direction, oldest span first. Errors name `path`; a write refused for
  // space says the file needs file_bytes.
  UringQueue(int fd, std::string path, size_t file_bytes, size_t block_bytes, int queue_depth);
  ~UringQueue();  // waits for everything posted (the spans' memory must outlive the I/O)
  UringQueue(const UringQueue&) = delete;
  UringQueue& operator=(const UringQueue&) = delete;

  // Starts the spans' I/O; the memory they name must stay put until wait(ticket) returns.
  Ticket post(IoDir dir, std::vector<IoSpan> spans);
  // Blocks until every span of `ticket` is done; throws pentad::Error with its first failure
  // (after its other requests have finished, so their memory is free again). Once per ticket.
  void wait(Ticket ticket);
  // Waits for every ticket not yet waited for and forgets them, errors included: for
  // unwinding, so that no transfer is left writing into memory about to be reused.
  void drain() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pentad
