// Checkpoint write and read bandwidth. Writes `mib` MiB of f32 shards as `ranks` rank
// files (one after another, as one process), commits, drops the files from the page cache,
// then reads every tensor back whole (resharding: each read spans all rank files) and
// checks the bytes. Compare with the disk:  dd if=/dev/zero of=/tmp/x bs=1M count=1024
// oflag=direct
//
//   pentad_checkpoint_bench [dir=/tmp/pentad-ckpt-bench] [mib=1024] [ranks=4]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"

using namespace pentad;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
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
  ckpt::commit(root, m, 1);
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
  return 0;
}
