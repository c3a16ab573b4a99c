#include "checkpoint/saver.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "core/check.h"

namespace pentad::ckpt {

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

AsyncSaver::~AsyncSaver() {
  if (thread_.joinable()) thread_.join();
}

void AsyncSaver::begin(std::vector<std::string> files, std::vector<LiveTensor> tensors,
                       bool asynchronous) {
  wait_for_file();  // one snapshot at a time: the previous one must be on disk
  const auto start = std::chrono::steady_clock::now();
  files_ = std::move(files);
  tensors_ = std::move(tensors);
  copied_ = false;
  file_done_ = false;
  error_.clear();
  busy_ = true;
  background_ = asynchronous;
  if (asynchronous) {
    thread_ = std::thread([this] { run(); });
  } else {
    run();
  }
  blocked_seconds_ += seconds_since(start);
}

void AsyncSaver::run() {
  // Allocating (and first touching) the staging buffers is part of the background work:
  // only the first snapshot pays it, and never on the training thread.
  // One uninitialised buffer, kept across snapshots: no zeroing pass before the copy.
  size_t total = 0;
  for (const LiveTensor& t : tensors_) total += static_cast<size_t>(t.info.local_shape.numel());
  if (total > staging_capacity_) {
    staging_.reset(new float[total]);
    staging_capacity_ = total;
  }
  std::vector<const float*> copies;
  size_t offset = 0;
  for (const LiveTensor& t : tensors_) {
    const size_t n = static_cast<size_t>(t.info.local_shape.numel());
    std::memcpy(staging_.get() + offset, t.live, n * sizeof(float));
    copies.push_back(staging_.get() + offset);
    offset += n;
  }
  copied_.store(true);
  copied_.notify_all();
  // The copy was on the optimizer's critical path; the write is not: below the training
  // threads, the writer takes the cycles they leave.
  if (background_) setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
  try {
    if (!tensors_.empty()) {
      std::vector<ShardData> shards;
      for (size_t i = 0; i < tensors_.size(); ++i)
        shards.push_back(ShardData{tensors_[i].info, copies[i]});
      for (const std::string& file : files_) write_rank_file(file, shards);
    }
  } catch (const std::exception& e) {
    error_ = e.what();
  }
  file_done_.store(true);
}

void AsyncSaver::wait_for_copy() {
  if (!busy_) return;
  const auto start = std::chrono::steady_clock::now();
  copied_.wait(false);
  blocked_seconds_ += seconds_since(start);
}

void AsyncSaver::wait_for_file() {
  if (!busy_) return;
  const auto start = std::chrono::steady_clock::now();
  if (thread_.joinable()) thread_.join();
  blocked_seconds_ += seconds_since(start);
  busy_ = false;
  if (!error_.empty()) fail("checkpoint write failed: {}", error_);
}

}  // namespace pentad::ckpt
