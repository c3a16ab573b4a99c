// Device memory through the CUDA runtime (linked in builds with CUDA), the copying half:
// copies between any two devices, page-locking, and the host staging that moves bytes
// to and from the device without (or with one counted) host wait. Allocation and the
// counters are device_memory_cuda.cpp's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "core/device_memory.h"
#include "core/device_memory_cuda.h"

namespace pentad {

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::CPU && src_device == Device::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
  // To or from pageable host memory the host waits; device to device it does not.
  if (dst_device == Device::CPU || src_device == Device::CPU) count_device_wait();
  const cudaMemcpyKind kind = dst_device == Device::CPU   ? cudaMemcpyDeviceToHost
                              : src_device == Device::CPU ? cudaMemcpyHostToDevice
                                                          : cudaMemcpyDeviceToDevice;
  check(cudaMemcpy(dst, src, bytes, kind), "cudaMemcpy");
}

void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
             size_t rows, Device device) {
  if (width == 0 || rows == 0) return;
  if (device == Device::CPU) {
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch,
                  static_cast<const char*>(src) + r * src_pitch, width);
    return;
  }
  check(cudaMemcpy2D(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice),
        "cudaMemcpy2D");
}

void copy(const Tensor& dst, const Tensor& src) {
  PENTAD_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy: {} {} into {} {}",
               dtype_name(src.dtype), src.shape.str(), dtype_name(dst.dtype), dst.shape.str());
  copy_bytes(dst.data, dst.device, src.data, src.device, src.bytes());
}

void host_pin(void* ptr, size_t bytes) {
  if (bytes == 0 || cuda_device_count() == 0) return;
  count_device_wait();
  check(cudaHostRegister(ptr, bytes, cudaHostRegisterDefault), "cudaHostRegister");
}

void host_unpin(void* ptr) noexcept {
  if (ptr && cuda_device_count() > 0) {
    if (cudaHostUnregister(ptr) != cudaSuccess) cudaGetLastError();
  }
}

AsyncCopier::AsyncCopier() = default;

AsyncCopier::~AsyncCopier() {
  if (stream_) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  for (void* e : marks_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

void AsyncCopier::begin_after_compute() {
  if (cuda_device_count() == 0) return;
  if (!stream_) {
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    stream_ = stream;
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    event_ = event;
  }
  marks_used_ = 0;
  // The kernels run on the legacy default stream (kernels/cuda/cuda_ops.h).
  check(cudaEventRecord(static_cast<cudaEvent_t>(event_), cudaStreamLegacy), "cudaEventRecord");
  check(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), static_cast<cudaEvent_t>(event_), 0),
      "cudaStreamWaitEvent");
}

void AsyncCopier::copy(void* dst, Device dst_device, const void* src, Device src_device,
                       size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::CPU && src_device == Device::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
  PENTAD_CHECK(stream_, "AsyncCopier: begin_after_compute() must come before device copies");
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream_)),
        "cudaMemcpyAsync");
}

void AsyncCopier::synchronize() {
  if (!stream_) return;
  count_device_wait();
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "cudaStreamSynchronize");
}

size_t AsyncCopier::mark() {
  if (!stream_) return 0;
  if (marks_used_ == marks_.size()) {
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    marks_.push_back(event);
  }
  check(cudaEventRecord(static_cast<cudaEvent_t>(marks_[marks_used_]),
                        static_cast<cudaStream_t>(stream_)),
        "cudaEventRecord");
  return marks_used_++;
}

void AsyncCopier::wait(size_t mark) {
  if (!stream_) return;
  PENTAD_CHECK(mark < marks_used_, "AsyncCopier: mark {} was not made since the last begin", mark);
  count_device_wait();
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(marks_[mark])), "cudaEventSynchronize");
}

UploadStaging::~UploadStaging() {
  for (Block& b : blocks_) cudaFreeHost(b.host);
}

void UploadStaging::copy(void* dst_device, const void* src_host, size_t bytes) {
  if (bytes == 0) return;
  while (current_ < blocks_.size() && blocks_[current_].used + bytes > blocks_[current_].bytes)
    ++current_;
  if (current_ == blocks_.size()) {
    Block b;
    b.bytes = std::max<size_t>(bytes, size_t{1} << 20);
    count_device_wait();
    check(cudaMallocHost(&b.host, b.bytes), "cudaMallocHost (upload staging)");
    blocks_.push_back(b);
  }
  Block& b = blocks_[current_];
  char* staged = b.host + b.used;
  b.used += (bytes + 255) / 256 * 256;
  std::memcpy(staged, src_host, bytes);
  check(cudaMemcpyAsync(dst_device, staged, bytes, cudaMemcpyHostToDevice, cudaStreamLegacy),
        "cudaMemcpyAsync (upload)");
}

void UploadStaging::rewind() {
  for (Block& b : blocks_) b.used = 0;
  current_ = 0;
}

StagedUpload::StagedUpload(int slots, size_t bytes) : slots_(size_t(slots)), slot_bytes_(bytes) {
  PENTAD_CHECK(slots >= 1, "StagedUpload: {} slots", slots);
  for (Slot& s : slots_) {
    count_device_wait();  // cudaMallocHost synchronises
    check(cudaMallocHost(&s.host, std::max<size_t>(bytes, 1)), "cudaMallocHost (staged upload)");
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    s.event = event;
  }
}

StagedUpload::~StagedUpload() {
  for (Slot& s : slots_) {
    // A copy still queued reads the slot: it must be done before the memory goes.
    if (s.event) {
      cudaEventSynchronize(static_cast<cudaEvent_t>(s.event));
      cudaEventDestroy(static_cast<cudaEvent_t>(s.event));
    }
    if (s.host) cudaFreeHost(s.host);
  }
}

void* StagedUpload::stage(size_t bytes) {
  PENTAD_CHECK(bytes <= slot_bytes_, "StagedUpload: {} bytes into slots of {}", bytes, slot_bytes_);
  Slot& s = slots_[next_];
  if (s.pending) {
    const auto event = static_cast<cudaEvent_t>(s.event);
    const cudaError_t rc = cudaEventQuery(event);
    if (rc == cudaErrorNotReady) {  // the device is a whole ring behind: wait for it
      count_device_wait();
      check(cudaEventSynchronize(event), "cudaEventSynchronize (staged upload)");
    } else {
      check(rc, "cudaEventQuery (staged upload)");
    }
    s.pending = false;
  }
  staged_ = next_;
  staged_bytes_ = bytes;
  next_ = (next_ + 1) % slots_.size();
  return s.host;
}

void StagedUpload::upload(void* dst_device) {
  Slot& s = slots_[staged_];
  PENTAD_CHECK(!s.pending, "StagedUpload: upload() without a stage() before it");
  if (staged_bytes_ == 0) return;
  // The kernels and NCCL's stream ordering both key on the legacy default stream.
  check(
      cudaMemcpyAsync(dst_device, s.host, staged_bytes_, cudaMemcpyHostToDevice, cudaStreamLegacy),
      "cudaMemcpyAsync (staged upload)");
  check(cudaEventRecord(static_cast<cudaEvent_t>(s.event), cudaStreamLegacy),
        "cudaEventRecord (staged upload)");
  s.pending = true;
}

HostStaging::~HostStaging() {
  for (Block& b : blocks_) {
    // An upload still queued reads the block: it must be done before the memory goes.
    if (b.event) {
      cudaEventSynchronize(static_cast<cudaEvent_t>(b.event));
      cudaEventDestroy(static_cast<cudaEvent_t>(b.event));
    }
    if (b.pinned)
      cudaFreeHost(b.host);
    else
      ::operator delete(b.host);
  }
}

void* HostStaging::acquire(size_t bytes, bool pinned) {
  pinned = pinned && cuda_device_count() > 0;
  Block* best = smallest_free(bytes, pinned);
  if (!best) {
    Block b;
    b.bytes = new_block_bytes(bytes);
    b.pinned = pinned;
    if (b.pinned) {
      count_device_wait();  // cudaMallocHost synchronises
      void* host = nullptr;
      check(cudaMallocHost(&host, b.bytes), "cudaMallocHost (communicator staging)");
      b.host = static_cast<char*>(host);
    } else {
      b.host = static_cast<char*>(::operator new(b.bytes));
    }
    blocks_.push_back(b);
    best = &blocks_.back();
  }
  if (best->pending) {  // the device has not yet run the uploads from its last use
    const auto event = static_cast<cudaEvent_t>(best->event);
    const cudaError_t rc = cudaEventQuery(event);
    if (rc == cudaErrorNotReady) {
      count_device_wait();
      check(cudaEventSynchronize(event), "cudaEventSynchronize (communicator staging)");
    } else {
      check(rc, "cudaEventQuery (communicator staging)");
    }
    best->pending = false;
  }
  best->in_use = true;
  best->uploads = false;
  return best->host;
}

void HostStaging::release(void* block) {
  Block& b = acquired(block);
  b.in_use = false;
  if (!b.uploads) return;
  if (!b.event) {
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    b.event = event;
  }
  // The kernels run on the legacy default stream, and so do the uploads (upload()).
  check(cudaEventRecord(static_cast<cudaEvent_t>(b.event), cudaStreamLegacy),
        "cudaEventRecord (communicator staging)");
  b.pending = true;
}

void HostStaging::download(void* at, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  Block& b = block_of(at, bytes);
  if (src_device == Device::CPU) {
    std::memcpy(at, src, bytes);
    return;
  }
  // An explicit direction: a host pointer labelled CUDA is an error here, not a host copy.
  check(cudaMemcpyAsync(at, src, bytes, b.pinned ? cudaMemcpyDeviceToHost : cudaMemcpyDefault,
                        cudaStreamLegacy),
        "cudaMemcpyAsync (communicator staging, from the device)");
  downloads_queued_ = true;
}

void HostStaging::wait_downloads() {
  if (!downloads_queued_) return;
  downloads_queued_ = false;
  count_device_wait();
  check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize (communicator staging)");
}

void HostStaging::upload(void* dst, Device dst_device, const void* at, size_t bytes) {
  if (bytes == 0) return;
  Block& b = block_of(at, bytes);
  if (dst_device == Device::CPU) {
    std::memcpy(dst, at, bytes);
    return;
  }
  check(cudaMemcpyAsync(dst, at, bytes, b.pinned ? cudaMemcpyHostToDevice : cudaMemcpyDefault,
                        cudaStreamLegacy),
        "cudaMemcpyAsync (communicator staging, to the device)");
  b.uploads = true;
}

StepReadback::~StepReadback() {
  if (host_) cudaFreeHost(host_);
}

const void* StepReadback::read(const void* device_src, size_t bytes) {
  if (bytes > capacity_) {
    if (host_) check(cudaFreeHost(host_), "cudaFreeHost (readback)");
    host_ = nullptr;
    capacity_ = 0;
    count_device_wait();
    check(cudaMallocHost(&host_, bytes), "cudaMallocHost (readback)");
    capacity_ = bytes;
  }
  count_device_wait();
  check(cudaMemcpyAsync(host_, device_src, bytes, cudaMemcpyDeviceToHost, cudaStreamLegacy),
        "cudaMemcpyAsync (readback)");
  check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize (readback)");
  return host_;
}

}  // namespace pentad
