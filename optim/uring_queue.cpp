#include "optim/uring_queue.h"

#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/check.h"

namespace pentad {

// Named rather than anonymous: Impl's members have these types, which GCC refuses
// (-Wsubobject-linkage) when this file is part of its floor's unity source.
namespace uring_queue_detail {

constexpr uint64_t kWakeTag = 0;  // user_data of the eventfd read; requests carry their address

struct Request {  // one block in flight; what is left of it after a short transfer
  UringQueue::Ticket ticket = 0;
  IoDir dir = IoDir::read;
  int64_t offset = 0;
  char* data = nullptr;
  size_t bytes = 0;
};

struct Job {  // a posted span not yet cut into requests
  UringQueue::Ticket ticket = 0;
  IoSpan span;
};

struct TicketState {
  int64_t requests_left = 0;
  std::string error;  // the first failure
};

}  // namespace uring_queue_detail
using uring_queue_detail::Job;
using uring_queue_detail::kWakeTag;
using uring_queue_detail::Request;
using uring_queue_detail::TicketState;

struct UringQueue::Impl {
  int fd;
  std::string path;
  size_t file_bytes, block_bytes;
  int queue_depth;
  io_uring ring{};
  int wake_fd = -1;  // post() and the destructor write it to get the thread out of its wait

  std::mutex mu;  // guards what follows, up to the thread's own state
  std::condition_variable done;
  std::deque<Job> pending[2];  // per IoDir
  std::unordered_map<Ticket, TicketState> tickets;
  Ticket next_ticket = 1;
  bool stopping = false;
  std::string broken;  // set when the ring itself failed: every later ticket fails with it

  // The I/O thread's own: the requests (2 * queue_depth, so a direction never waits for a
  // slot), those free, and how many of each direction are in flight.
  std::vector<Request> requests;
  std::vector<Request*> free_requests;
  int in_flight[2] = {0, 0};
  uint64_t wake_value = 0;
  std::thread thread;

  void arm_wake() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    PENTAD_CHECK(sqe != nullptr);
    io_uring_prep_read(sqe, wake_fd, &wake_value, sizeof wake_value, 0);
    io_uring_sqe_set_data64(sqe, kWakeTag);
  }

  void submit(Request* q) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    PENTAD_CHECK(sqe != nullptr, "the ring has one entry per request");
    if (q->dir == IoDir::read)
      io_uring_prep_read(sqe, fd, q->data, static_cast<unsigned>(q->bytes), q->offset);
    else
      io_uring_prep_write(sqe, fd, q->data, static_cast<unsigned>(q->bytes), q->offset);
    io_uring_sqe_set_data(sqe, q);
  }

  // Cuts pending spans into requests while a direction has room. Under mu.
  void fill() {
    for (int d = 0; d < 2; ++d) {
      while (in_flight[d] < queue_depth && !pending[d].empty()) {
        Job& job = pending[d].front();
        Request* q = free_requests.back();
        free_requests.pop_back();
        *q = Request{job.ticket, static_cast<IoDir>(d), job.span.offset, job.span.data,
                     std::min(job.span.bytes, block_bytes)};
        job.span.offset += static_cast<int64_t>(q->bytes);
        job.span.data += q->bytes;
        job.span.bytes -= q->bytes;
        if (job.span.bytes == 0) pending[d].pop_front();
        ++in_flight[d];
        submit(q);
      }
    }
  }

  std::string error_text(const Request& q, int err) const {
    const char* what = q.dir == IoDir::read ? "read" : "write";
    if (err == ENOSPC)
      return fmt::format(
          "{}: No space left on device: writing at offset {}; the file needs {} "
          "bytes ({:.1f} MiB)",
          path, q.offset, file_bytes, file_bytes / 1048576.0);
    return fmt::format("{}: cannot {} {} bytes at offset {}: {}", path, what, q.bytes, q.offset,
                       std::strerror(err));
  }

  void finish(Request* q, std::string error) {
    std::lock_guard lock(mu);
    TicketState& t = tickets.at(q->ticket);
    if (t.error.empty()) t.error = std::move(error);
    if (--t.requests_left == 0) done.notify_all();
    --in_flight[static_cast<int>(q->dir)];
    free_requests.push_back(q);
  }

  void complete(io_uring_cqe* cqe) {
    if (io_uring_cqe_get_data64(cqe) == kWakeTag) {  // woken by post() or the destructor
      arm_wake();
      return;
    }
    auto* q = static_cast<Request*>(io_uring_cqe_get_data(cqe));
    const int res = cqe->res;
    if (res == -EAGAIN || res == -EINTR) return submit(q);  // the same request again
    if (res < 0) return finish(q, error_text(*q, -res));
    if (res == 0)  // nothing moved: past the end of the file (reads) or a device gone mad
      return finish(q, q->dir == IoDir::read ? fmt::format("{}: unexpected end of file at offset "
                                                           "{} (the file is shorter than {} bytes)",
                                                           path, q->offset, file_bytes)
                                             : error_text(*q, EIO));
    // A short transfer: the rest goes again from where it stopped.
    q->offset += res;
    q->data += res;
    q->bytes -= static_cast<size_t>(res);
    if (q->bytes > 0) return submit(q);
    finish(q, {});
  }

  // Fails every ticket with `why` and stops taking work (the ring cannot be trusted now).
  void break_down(std::string why) {
    std::lock_guard lock(mu);
    broken = std::move(why);
    for (auto& [ticket, state] : tickets) {
      if (state.error.empty()) state.error = broken;
      state.requests_left = 0;
    }
    pending[0].clear();
    pending[1].clear();
    done.notify_all();
  }

  void run() {
    arm_wake();
    for (;;) {
      bool stop;
      {
        std::lock_guard lock(mu);
        fill();
        stop = stopping && in_flight[0] + in_flight[1] == 0;
      }
      if (stop) return;
      // One system call: hand the kernel what fill() and complete() queued, sleep until at
      // least one completion (the wake read is always armed, so post() can end the sleep).
      const int err = io_uring_submit_and_wait(&ring, 1);
      if (err == -EAGAIN || err == -EBUSY) {  // the kernel is short of memory: try again soon
        std::this_thread::yield();
      } else if (err < 0 && err != -EINTR) {
        return break_down(
            fmt::format("{}: io_uring_submit_and_wait: {}", path, std::strerror(-err)));
      }
      io_uring_cqe* cqe = nullptr;
      unsigned head, seen = 0;
      io_uring_for_each_cqe(&ring, head, cqe) {
        complete(cqe);
        ++seen;
      }
      io_uring_cq_advance(&ring, seen);
    }
  }

  void wake() {
    const uint64_t one = 1;
    // Cannot fail short of a bad descriptor: the counter would need 2^64 - 1 wakes pending.
    [[maybe_unused]] ssize_t n = ::write(wake_fd, &one, sizeof one);
  }
};

UringQueue::UringQueue(int fd, std::string path, size_t file_bytes, size_t block_bytes,
                       int queue_depth)
    : impl_(std::make_unique<Impl>()) {
  PENTAD_CHECK(block_bytes > 0 && queue_depth > 0);
  Impl& s = *impl_;
  s.fd = fd;
  s.path = std::move(path);
  s.file_bytes = file_bytes;
  s.block_bytes = block_bytes;
  s.queue_depth = queue_depth;
  const unsigned entries = static_cast<unsigned>(2 * queue_depth + 1);  // + the wake read
  if (int err = io_uring_queue_init(entries, &s.ring, 0); err < 0)
    fail(
        "{}: cannot set up io_uring ({} entries) for the offload file: {} (the NVMe offload "
        "needs io_uring: Linux 5.6 or later, and not disabled by kernel.io_uring_disabled)",
        s.path, entries, std::strerror(-err));
  s.wake_fd = ::eventfd(0, EFD_CLOEXEC);
  if (s.wake_fd < 0) {
    const int err = errno;
    io_uring_queue_exit(&s.ring);
    fail("{}: eventfd: {}", s.path, std::strerror(err));
  }
  s.requests.resize(2 * static_cast<size_t>(queue_depth));
  for (Request& q : s.requests) s.free_requests.push_back(&q);
  s.thread = std::thread([&s] { s.run(); });
}

UringQueue::~UringQueue() {
  Impl& s = *impl_;
  drain();
  {
    std::lock_guard lock(s.mu);
    s.stopping = true;
  }
  s.wake();
  s.thread.join();
  io_uring_queue_exit(&s.ring);  // cancels the wake read still armed
  ::close(s.wake_fd);
}

UringQueue::Ticket UringQueue::post(IoDir dir, std::vector<IoSpan> spans) {
  Impl& s = *impl_;
  Ticket ticket;
  {
    std::lock_guard lock(s.mu);
    ticket = s.next_ticket++;
    TicketState& t = s.tickets[ticket];
    if (!s.broken.empty()) {
      t.error = s.broken;
      return ticket;
    }
    for (const IoSpan& span : spans) {
      if (span.bytes == 0) continue;
      t.requests_left += static_cast<int64_t>((span.bytes + s.block_bytes - 1) / s.block_bytes);
      s.pending[static_cast<int>(dir)].push_back({ticket, span});
    }
  }
  s.wake();
  return ticket;
}

void UringQueue::wait(Ticket ticket) {
  Impl& s = *impl_;
  std::string error;
  {
    std::unique_lock lock(s.mu);
    auto it = s.tickets.find(ticket);
    PENTAD_CHECK(it != s.tickets.end(), "ticket {} waited for twice, or never posted", ticket);
    s.done.wait(lock, [&] { return it->second.requests_left == 0; });
    error = std::move(it->second.error);
    s.tickets.erase(it);
  }
  if (!error.empty()) throw Error(error);
}

void UringQueue::drain() noexcept {
  Impl& s = *impl_;
  std::unique_lock lock(s.mu);
  s.done.wait(lock, [&] {
    return std::all_of(s.tickets.begin(), s.tickets.end(),
                       [](const auto& t) { return t.second.requests_left == 0; });
  });
  s.tickets.clear();
}

}  // namespace pentad
