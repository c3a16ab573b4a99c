#pragma once
// Optimizer state kept in a file on an NVMe drive instead of in memory (ZeRO-Infinity's
// offload): the state streams through a few host buffers sub-group by sub-group, the next
// sub-group's read and the last one's write in flight while the optimizer updates this one.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

namespace pentad {

class UringQueue;
enum class IoDir;

struct NvmeOptions {
  std::string dir;  // parallel.offload_path: an existing, writable directory
  // 1 MiB x 32: measured against fio in bench/RESULTS.md ("2026-11-25 — NVMe offload
  // engine"); the best writes there, and a whole default sub-group of AdamW's two tensors
  // (2 x 16 MiB) in flight at once, so the transfers go on while fn holds the CPU.
  size_t block_bytes = size_t{1} << 20;          // bytes per io_uring request; a multiple of 4096
  int queue_depth = 32;                          // requests in flight per direction
  int64_t subgroup_elements = int64_t{1} << 22;  // elements per tensor per pipeline step
};

// `tensors` float arrays of `elements` each (AdamW: 2, m and v) in one file, dir/file_name,
// laid out sub-group by sub-group:
//   [g0: t0 | t1 | ...][g1: t0 | t1 | ...] ...   each piece padded to 4 KiB
// so that a sub-group is one contiguous, aligned stretch of the file. The file is created
// (reading as zeros) and preallocated by the constructor and deleted by the destructor.
// Not thread-safe: one caller at a time.
class NvmeState {
 public:
  using UpdateFn = std::function<void(int64_t begin, int64_t end, float* const* state)>;

  NvmeState(const NvmeOptions& options, const std::string& file_name, int64_t elements,
            int tensors);
  ~NvmeState();
  NvmeState(const NvmeState&) = delete;
  NvmeState& operator=(const NvmeState&) = delete;

  // Streams every sub-group through host memory in order: fn(begin, end, state) sees
  // state[t] = tensor t's elements [begin, end), as in the file; what fn leaves there is
  // written back. While fn runs on sub-group k, k + 1 is being read and k - 1 written.
  void update(const UpdateFn& fn);
  // The same stream without the write-back: fn reads every sub-group once (a checkpoint
  // snapshot of the whole state at one pass over the file, whole sub-groups per request).
  void scan(const UpdateFn& fn);
  // Tensor t's elements [begin, end) out of / into the file, whole (checkpoints, tests).
  void read(int tensor, int64_t begin, int64_t end, float* out);
  void write(int tensor, int64_t begin, int64_t end, const float* in);
  // Tensor t's elements [begin, end) read in the background (ZeRO-3's parameter shares,
  // fetched while the layer before computes): start_read() posts the reads of the pages
  // holding them into a staging buffer of their own (O_DIRECT cannot land at `out`'s
  // alignment); finish_read() waits for them and copies the elements to out. No update()
  // or write() while one is outstanding (they would race on the file).
  uint64_t start_read(int tensor, int64_t begin, int64_t end);
  void finish_read(uint64_t read, float* out);
  int64_t read_elements(uint64_t read) const;  // end - begin of a start_read() in flight

  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }  // false: the file system refused O_DIRECT
  size_t file_bytes() const { return file_bytes_; }
  int tensors() const { return tensors_; }
  // Elements per tensor of every sub-group but the last: update()'s fn sees [begin, end) cut
  // at its multiples.
  int64_t subgroup_elements() const { return group_size_; }
  size_t host_buffer_bytes() const { return 3 * static_cast<size_t>(tensors_) * piece_bytes_; }

  // Since construction: bytes moved to and from the file, and the seconds update() was
  // blocked waiting for reads and for writes (the I/O that fn did not hide); of the reads,
  // the background ones (start_read) and the seconds finish_read() waited for them.
  struct Stats {
    double bytes_read = 0, bytes_written = 0, read_wait_s = 0, write_wait_s = 0;
    double background_bytes = 0, background_wait_s = 0;
  };
  Stats stats() const { return stats_; }

 private:
  struct Buffer;      // aligned host memory
  struct Background;  // a start_read() in flight: its staging buffer and where elements go
  void stream(const UpdateFn& fn, bool write_back);  // update() and scan()
  int64_t groups() const;
  int64_t group_elements(int64_t g) const;  // the last group may be short
  int64_t piece_offset(int64_t g, int tensor) const;
  size_t piece_bytes(int64_t g) const;  // one tensor's elements of group g, padded to 4 KiB
  char* slot_piece(int slot, int tensor) const;
  // Starts moving `tensors` pieces of group g, from first_tensor on, between the file and
  // slot's pieces 0, 1, ...; returns the queue's ticket.
  uint64_t post(IoDir dir, int64_t g, int slot, int first_tensor, int tensors);
  void check_range(int tensor, int64_t begin, int64_t end) const;

  NvmeOptions options_;
  std::string path_;
  int64_t elements_;
  int tensors_;
  int64_t group_size_;  // elements per full group
  size_t piece_bytes_;  // piece_bytes of a full group: what one slot holds per tensor
  size_t file_bytes_ = 0;
  int fd_ = -1;
  bool direct_ = true;
  std::unique_ptr<Buffer> buffer_;  // 3 slots x tensors x piece_bytes_
  std::unique_ptr<UringQueue> queue_;
  std::unordered_map<uint64_t, std::unique_ptr<Background>> background_;  // by queue ticket
  Stats stats_;
};

}  // namespace pentad
