#pragma once
// Device memory: the one place that allocates, frees, fills and copies memory on a CUDA
// device. Builds with CUDA link device_memory_cuda.cpp (allocation, counters, the device)
// and device_copy_cuda.cpp (copies, staging); builds without it link
// device_memory_none.cpp, which sees no device and refuses to allocate, so no caller needs
// an #ifdef. Every call works on the current CUDA device and waits for completion
// (cudaMemcpy and cudaMemset order with the legacy default stream the kernels run on).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace pentad {

// Visible CUDA devices; 0 when there is none, no driver, or CUDA is not built.
int cuda_device_count();

// cudaMalloc; fails with a message naming `what` and the size.
void* device_alloc(size_t bytes, const std::string& what);
void device_free(void* ptr) noexcept;

// What this process holds on CUDA devices through pentad's allocators (device_alloc and
// DeviceReservation's mappings), now and at most since the last reset: a rank's own memory,
// where cudaMemGetInfo sees the whole device, every process on it. Arenas are named
// "the <name> arena"; the kernels' workspaces and scratch by what they are.
struct DeviceMemoryUse {
  size_t bytes = 0, peak_bytes = 0;              // everything
  size_t arena_bytes = 0, arena_peak_bytes = 0;  // the arenas only (what the plan estimates)
};
DeviceMemoryUse device_memory_use();
void reset_device_memory_peak();  // the peaks restart from what is held now
void device_zero(void* ptr, size_t bytes);
// Fills with 0xff bytes: NaN in f32 and bf16 (tests poison outputs with it).
void device_fill_ones(void* ptr, size_t bytes);

// Device addresses reserved with nothing behind them (CUDA's virtual memory API), for
// Arena::reserved(): map() backs a part with device memory for the reservation's life; the
// destructor unmaps and frees it all (which waits for the device). The driver's entry points
// are looked up at run time, so builds with CUDA still start where there is no driver.
// Without CUDA: constructing one fails.
class DeviceReservation {
 public:
  DeviceReservation(size_t bytes, const std::string& what);  // rounded up to granules
  ~DeviceReservation();
  DeviceReservation(const DeviceReservation&) = delete;
  DeviceReservation& operator=(const DeviceReservation&) = delete;
  void* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  size_t granule() const { return granule_; }  // the device's allocation granularity
  // Backs bytes [offset, offset + bytes), both multiples of granule(), not backed before.
  void map(size_t offset, size_t bytes);

 private:
  struct Mapping {
    size_t offset = 0, bytes = 0;
    unsigned long long handle = 0;  // CUmemGenericAllocationHandle
  };
  void* base_ = nullptr;
  size_t bytes_ = 0, granule_ = 0;
  int device_ = 0;
  std::string what_;
  std::vector<Mapping> mappings_;
};

// Copies bytes between any two devices (host or CUDA).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

// Copies `rows` rows of `width` bytes, rows `src_pitch` and `dst_pitch` bytes apart, within
// one device (cudaMemcpy2D on CUDA): the strided gathers of context parallelism's layouts.
void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
             size_t rows, Device device);

// Copies src into dst: same dtype and element count, any devices.
void copy(const Tensor& dst, const Tensor& src);

// Makes device (local_rank modulo the visible devices) this host thread's current device
// and returns its index; fails with a message when no CUDA device is visible.
int select_cuda_device(int local_rank);
// One line naming the current device ("NVIDIA H100 80GB HBM3, 79.1 GiB, sm_90").
std::string cuda_device_description();
// The current device's PCI bus id ("0000:3b:00.0"), the same in every process on the machine
// whatever CUDA_VISIBLE_DEVICES numbers it: how ranks tell that they share a GPU. "" without
// CUDA or a device.
std::string cuda_device_pci_bus_id();
// The current CUDA device's memory in bytes (every process on it shares it); 0 without one.
size_t cuda_device_memory_bytes();
// Blocks until every kernel and copy issued so far on the current device has finished.
void device_synchronize();

// Page-locks host memory so that AsyncCopier's transfers from the device run truly
// asynchronously (cudaHostRegister). No-ops in builds without CUDA.
void host_pin(void* ptr, size_t bytes);
void host_unpin(void* ptr) noexcept;

// Copies between device and host memory on a private CUDA stream that the compute stream
// does not wait for, so a background thread can drain device state while kernels run.
// begin_after_compute(), called on the thread that issues the kernels, orders the copies
// queued after it behind everything already issued (an event on the compute stream);
// copy() queues, synchronize() waits for all; mark() records how far the queue has got and
// wait(mark) waits for the copies queued before it (marks last until the next
// begin_after_compute()). Host-to-host copies are plain memcpy. Without CUDA only host-to-host
// copies exist, and marks are passed at once.
class AsyncCopier {
 public:
  AsyncCopier();
  ~AsyncCopier();
  AsyncCopier(const AsyncCopier&) = delete;
  AsyncCopier& operator=(const AsyncCopier&) = delete;
  void begin_after_compute();
  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
  void synchronize();
  size_t mark();
  void wait(size_t mark);

 private:
  void* stream_ = nullptr;    // cudaStream_t
  void* event_ = nullptr;     // cudaEvent_t
  std::vector<void*> marks_;  // cudaEvent_t, reused from one begin_after_compute() to the next
  size_t marks_used_ = 0;
};

// Host waits, counted process-wide: every call of this file that makes the host wait for
// the device (a copy to or from host memory, device_synchronize, allocating or freeing
// device memory, pinning, AsyncCopier::synchronize, StepReadback::read), and the CUDA calls
// elsewhere that wait and say so through count_device_wait() (the kernels' scratch growth
// and sum_squares, NCCL's barrier). The GPU suite checks that a training step waits once.
// Always 0 in builds without CUDA.
int64_t device_waits();
void count_device_wait();

// Copies of small host data (token ids) to the device that do not make the host wait: the
// bytes go into page-locked staging memory, from which a copy is queued on the compute
// stream. Staging is handed out in order and reused only after rewind(), which the owner
// calls once the device has run every copy queued before (after a readback that
// synchronised the compute stream); until then it grows (a page-locked allocation, which
// waits: the first step's only).
class UploadStaging {
 public:
  UploadStaging() = default;
  ~UploadStaging();
  UploadStaging(const UploadStaging&) = delete;
  UploadStaging& operator=(const UploadStaging&) = delete;
  void copy(void* dst_device, const void* src_host, size_t bytes);
  void rewind();

 private:
  struct Block {
    char* host = nullptr;
    size_t bytes = 0, used = 0;
  };
  std::vector<Block> blocks_;
  size_t current_ = 0;  // the block being filled
};

// Uploads of host data of known size to the device, each from a page-locked slot that is
// reused only once the device has run the copy from it (ZeRO-3's parameter shares read from
// NVMe, optim/adamw.h): stage() hands out the next of `slots` slots of `bytes` each; the
// caller fills it and upload() queues its copy on the compute stream, so that kernels and
// collectives issued after it (the unit's all-gather) see the data, and records an event
// behind it. Stream rule: the host waits only in stage(), for a slot whose last copy the
// device has not run yet, i.e. when the compute stream is `slots` uploads behind the host.
// Without CUDA there is no device to upload to: constructing one fails.
class StagedUpload {
 public:
  StagedUpload(int slots, size_t bytes);
  ~StagedUpload();
  StagedUpload(const StagedUpload&) = delete;
  StagedUpload& operator=(const StagedUpload&) = delete;
  // A free slot of slot_bytes(); `bytes` (at most that) is what the next upload() copies.
  void* stage(size_t bytes);
  // Queues the copy of the slot stage() last returned to dst_device (the bytes asked there).
  void upload(void* dst_device);
  size_t slot_bytes() const { return slot_bytes_; }
  size_t staging_bytes() const { return slot_bytes_ * slots_.size(); }

 private:
  struct Slot {
    void* host = nullptr;   // page-locked
    void* event = nullptr;  // cudaEvent_t: recorded after the slot's last copy
    bool pending = false;   // a copy from it was queued since the event was last waited for
  };
  std::vector<Slot> slots_;
  size_t slot_bytes_ = 0;
  size_t next_ = 0;          // the slot stage() hands out next
  size_t staged_ = 0;        // the slot stage() returned last
  size_t staged_bytes_ = 0;  // and the bytes its upload copies
};

// Host memory through which a communicator moves tensors of any device (the staged backend,
// parallel/staged_comm.cpp). acquire() hands out a block (page-locked when asked for and a
// CUDA device is visible, plain host memory otherwise: a CPU run creates no CUDA context),
// release() takes it back; blocks are kept for reuse.
// Stream rule (CUDA): download() queues a copy from the device into a block on the compute
// stream, and wait_downloads() makes the host wait for every one queued, so the bytes follow
// every kernel issued before; upload() queues a copy from a block to the device on the
// compute stream and returns at once: later kernels see it. release() records an event
// behind a block's uploads, and acquire() hands the block out again only once the device has
// passed it. Host memory (Device::CPU) is copied with memcpy in both directions, at once.
// One thread uses an instance.
class HostStaging {
 public:
  HostStaging() = default;
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  // At least `bytes` (0 is fine), free of pending copies; pinned: for copies to and from a
  // device.
  void* acquire(size_t bytes, bool pinned);
  void release(void* block);
  // `at` and `bytes` lie inside one acquired block.
  void download(void* at, const void* src, Device src_device, size_t bytes);
  void wait_downloads();
  void upload(void* dst, Device dst_device, const void* at, size_t bytes);
  size_t held_bytes() const;  // every block, free or not
  // Whether bytes [at, at + bytes) lie in a block of block_bytes at `block`: `at` itself must
  // lie inside, so the end of one block is never taken for the next, which page-locked
  // allocations can place right after it.
  static bool holds(const void* block, size_t block_bytes, const void* at, size_t bytes);

 private:
  struct Block {
    char* host = nullptr;
    size_t bytes = 0;
    bool pinned = false;  // cudaMallocHost, else operator new
    bool in_use = false;
    bool uploads = false;   // uploads queued from it since it was acquired
    void* event = nullptr;  // cudaEvent_t, recorded at release() after uploads
    bool pending = false;   // the event may not have passed yet
  };
  // The bookkeeping both backends share (core/host_staging.cpp): the smallest free block of
  // at least `bytes` (pinned where asked), a new block's size, the acquired block a span lies
  // in, and the acquired block that starts at `block` (release()).
  Block* smallest_free(size_t bytes, bool pinned);
  static size_t new_block_bytes(size_t bytes);
  Block& block_of(const void* at, size_t bytes);
  Block& acquired(const void* block);
  std::vector<Block> blocks_;
  bool downloads_queued_ = false;
};

// A readback of a few device bytes into page-locked host memory owned here: one copy
// queued on the compute stream and one synchronisation of it, so the values follow every
// kernel issued before. The training step's one host wait (train/trainer.cpp).
class StepReadback {
 public:
  StepReadback() = default;
  ~StepReadback();
  StepReadback(const StepReadback&) = delete;
  StepReadback& operator=(const StepReadback&) = delete;
  // The bytes, valid until the next read.
  const void* read(const void* device_src, size_t bytes);

 private:
  void* host_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace pentad
