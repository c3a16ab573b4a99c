// Checkpoint write and read bandwidth. Writes `mib` MiB of f32 shards as `ranks` rank
// files (one after another, as one process), commits, drops the files from the page cache,
// then reads every tensor back whole (resharding: each read spans all rank files) and
// checks the bytes. Compare with the disk:  dd if=/dev/zero of=/tmp/x bs=1M count=1024
// oflag=direct
//
// Then the CPU cost of one background save of the same state, by phase, in seconds of
// the thread's own CPU time (user + system; what it takes from training): the copy into
// staging, the old zlib crc32 pass and the xxh3-64 that replaces it, the copy with xxh3
// folded in (what the saver does), and writing the file buffered (through the page cache)
// against direct I/O.
//
//   pentad_checkpoint_bench [dir=/tmp/pentad-ckpt-bench] [mib=1024] [ranks=4]
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checksum.h"
#include "checkpoint/saver.h"

using namespace pentad;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double thread_cpu() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Runs f once and prints its wall and CPU seconds and bandwidth over `bytes`.
template <typename F>
void phase(const char* what, double bytes, F f) {
  const double wall = now(), cpu = thread_cpu();
  f();
  const double w = now() - wall, c = thread_cpu() - cpu;
  std::printf("  %-34s wall %6.3f s  cpu %6.3f s  (%5.1f GB/s of wall)\n", what, w, c,
              bytes / 1e9 / w);
}

void drop_from_page_cache(const std::string& dir) {
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    const int fd = ::open(f.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string root = argc > 1 ? argv[1] : "/tmp/pentad-ckpt-bench";
  const int64_t mib = argc > 2 ? std::stoll(argv[2]) : 1024;
  const int ranks = argc > 3 ? std::stoi(argv[3]) : 4;
  const int64_t tensors = 16;  // each split along dim 0 over the ranks
  const int64_t cols = 4096;
  const int64_t rows = mib * (1 << 20) / 4 / tensors / cols / ranks * ranks;
  std::filesystem::remove_all(root);

  std::vector<std::vector<float>> data(static_cast<size_t>(tensors));
  for (int64_t t = 0; t < tensors; ++t) {
    data[static_cast<size_t>(t)].resize(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < data[static_cast<size_t>(t)].size(); ++i)
      data[static_cast<size_t>(t)][i] = static_cast<float>(i % 1000) * 0.5f + static_cast<float>(t);
  }
  const double bytes = static_cast<double>(tensors * rows * cols * 4);

  const double t0 = now();
  for (int r = 0; r < ranks; ++r) {
    std::vector<ckpt::ShardData> shards;
    const int64_t local = rows / ranks;
    for (int64_t t = 0; t < tensors; ++t)
      shards.push_back({ckpt::ShardInfo{"param/t" + std::to_string(t), Shape{rows, cols}, 0,
                                        r * local, Shape{local, cols}, 0},
                        data[static_cast<size_t>(t)].data() + r * local * cols});
    ckpt::write_rank_file(ckpt::partial_dir(root, 1) + "/" + ckpt::rank_file_name(r), shards);
  }
  ckpt::Manifest m;
  m.step = 1;
  ckpt::remove_dirs(ckpt::commit(root, m, 1));
  const double t1 = now();
  std::printf("write+fsync+commit: %.0f MiB in %.2f s = %.0f MB/s\n", bytes / (1 << 20), t1 - t0,
              bytes / 1e6 / (t1 - t0));

  const std::string dir = ckpt::checkpoint_dir(root, 1);
  drop_from_page_cache(dir);
  std::vector<float> out(static_cast<size_t>(rows * cols));
  double seconds = 0.0;
  ckpt::Reader reader(dir);
  for (int64_t t = 0; t < tensors; ++t) {
    const double t2 = now();
    reader.read("param/t" + std::to_string(t), Shape{rows, cols}, -1, 0, Shape{rows, cols},
                out.data());
    seconds += now() - t2;
    if (std::memcmp(out.data(), data[static_cast<size_t>(t)].data(), out.size() * 4) != 0) {
      std::printf("MISMATCH in tensor %ld\n", static_cast<long>(t));
      return 1;
    }
  }
  std::printf("read+verify (cold cache): %.0f MiB in %.2f s = %.0f MB/s\n", bytes / (1 << 20),
              seconds, bytes / 1e6 / seconds);
  std::filesystem::remove_all(root);

  // One background save's work, by phase (one rank file holding every tensor).
  std::printf("background save of %.0f MiB, by phase (this thread's CPU time):\n",
              bytes / (1 << 20));
  std::vector<ckpt::LiveTensor> live;
  for (int64_t t = 0; t < tensors; ++t)
    live.push_back({ckpt::ShardInfo{"param/t" + std::to_string(t), Shape{rows, cols}, -1, 0,
                                    Shape{rows, cols}, 0},
                    data[static_cast<size_t>(t)].data()});
  ckpt::AsyncSaver saver;
  const std::string file = ckpt::partial_dir(root, 2) + "/" + ckpt::rank_file_name(0);
  saver.begin({file}, live, false);  // first snapshot: allocates and touches the staging
  saver.wait_for_file();
  std::filesystem::remove_all(root);
  std::vector<float> staging(static_cast<size_t>(rows * cols));
  const size_t tensor_bytes = staging.size() * sizeof(float);
  phase("memcpy into staging", bytes, [&] {
    for (int64_t t = 0; t < tensors; ++t)
      std::memcpy(staging.data(), data[static_cast<size_t>(t)].data(), tensor_bytes);
  });
  uint64_t sink = 0;
  phase("zlib crc32 (version 1)", bytes, [&] {
    for (int64_t t = 0; t < tensors; ++t)
      sink += ckpt::checksum_of(ckpt::ChecksumKind::Crc32, data[static_cast<size_t>(t)].data(),
                                tensor_bytes);
  });
  phase("xxh3-64", bytes, [&] {
    for (int64_t t = 0; t < tensors; ++t)
      sink += ckpt::checksum_of(ckpt::ChecksumKind::Xxh3_64, data[static_cast<size_t>(t)].data(),
                                tensor_bytes);
  });
  saver.begin({file}, live, false);  // synchronous: copy and write on this thread
  saver.wait_for_file();
  std::filesystem::remove_all(root);
  const ckpt::AsyncSaver::Timings t = saver.last_timings();
  std::printf("  %-34s wall %6.3f s  cpu %6.3f s  (%5.1f GB/s of wall)\n",
              "saver: copy with xxh3 folded in", t.copy_seconds, t.copy_cpu_seconds,
              bytes / 1e9 / t.copy_seconds);
  std::printf("  %-34s wall %6.3f s  cpu %6.3f s  (%5.1f GB/s of wall)\n",
              "saver: write (direct I/O) + fsync", t.write_seconds, t.write_cpu_seconds,
              bytes / 1e9 / t.write_seconds);
  // The write alone, from page-aligned memory (checksums given), buffered against direct.
  std::unique_ptr<float[], decltype(&std::free)> aligned(
      static_cast<float*>(std::aligned_alloc(4096, (tensor_bytes + 4095) / 4096 * 4096)),
      &std::free);
  std::memcpy(aligned.get(), data[0].data(), tensor_bytes);
  std::vector<ckpt::ShardData> shards;
  for (const ckpt::LiveTensor& l : live) shards.push_back({l.info, aligned.get(), true});
  for (const bool direct : {false, true}) {
    phase(direct ? "write_rank_file, direct I/O + fsync" : "write_rank_file, buffered + fsync",
          bytes, [&] { ckpt::write_rank_file(file, shards, direct); });
    std::filesystem::remove_all(root);
  }
  if (sink == 42) std::printf(" ");
  return 0;
}
