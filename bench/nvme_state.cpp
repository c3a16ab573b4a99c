// NVMe offload bandwidth (optim/nvme_state) against what the disk gives fio (bench/nvme_bench.sh
// runs both). Three passes over files of `gib` GiB in `dir`:
//   write   one tensor, written whole with NvmeState::write (sequential, like fio --rw=write)
//   read    the same, read back whole and checked
//   update  an AdamW state (m, v: two tensors of the same total size, written with the same
//           data first) streamed through update(): once with an empty fn (the I/O alone,
//           reads and writes overlapping each other), then with an AdamW-like elementwise fn
// hidden = 1 - (time update() waited on I/O with the real fn) / (the empty fn's update time):
// the share of the I/O that the fn's compute covered; at most hideable = fn time / I/O time
// (when the I/O takes longer than the compute, the rest must show).
//
//   pentad_nvme_bench [--dir=/tmp/pentad-nvme-bench] [--gib=2] [--block-kib=B] [--depth=Q]
//                     [--subgroup-mib=S]
// B, Q and S default to NvmeOptions' defaults (1024 KiB, 32, 16 MiB).
// The last line is key=value pairs for scripts.
#include "optim/nvme_state.h"

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/check.h"

using namespace pentad;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// User + system seconds of the whole process (the I/O thread and io_uring's workers included).
double cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](timeval t) { return double(t.tv_sec) + 1e-6 * double(t.tv_usec); };
  return s(u.ru_utime) + s(u.ru_stime);
}

// --name=value, or the default.
std::string flag(int argc, char** argv, const std::string& name, const std::string& fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  return fallback;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string dir = flag(argc, argv, "dir", "/tmp/pentad-nvme-bench");
  const double gib = std::stod(flag(argc, argv, "gib", "2"));
  NvmeOptions opt;
  opt.dir = dir;
  opt.block_bytes = std::stoul(flag(argc, argv, "block-kib", std::to_string(opt.block_bytes >> 10)))
                    << 10;
  opt.queue_depth = std::stoi(flag(argc, argv, "depth", std::to_string(opt.queue_depth)));
  const int64_t subgroup_mib = opt.subgroup_elements * 4 >> 20;
  opt.subgroup_elements =
      std::stoll(flag(argc, argv, "subgroup-mib", std::to_string(subgroup_mib))) << 20 >> 2;
  std::filesystem::create_directories(dir);
  const double bytes = gib * double(1 << 30);
  const auto elements = static_cast<int64_t>(bytes / sizeof(float));

  // Not zeros: a disk or file system may store zeros without moving them (a fresh,
  // preallocated extent even reads as zeros without touching the disk).
  std::vector<float> x(static_cast<size_t>(elements));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 65521) + 0.5f;
  double write_s, read_s, write_cpu, read_cpu;
  {
    NvmeState seq(opt, "pentad-nvme-bench.state", elements, 1);
    double t0 = now(), c0 = cpu_s();
    seq.write(0, 0, elements, x.data());
    write_s = now() - t0;
    write_cpu = cpu_s() - c0;
    std::vector<float> y(x.size());
    t0 = now(), c0 = cpu_s();
    seq.read(0, 0, elements, y.data());
    read_s = now() - t0;
    read_cpu = cpu_s() - c0;
    PENTAD_CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0,
                 "read back differs");
    std::printf("%s: %.2f GiB, O_DIRECT %s, block %zu KiB, depth %d, sub-group %lld elements\n",
                seq.path().c_str(), bytes / (1 << 30), seq.direct() ? "yes" : "NO (buffered)",
                opt.block_bytes >> 10, opt.queue_depth, (long long)opt.subgroup_elements);
  }
  std::printf("write  %.3f s  %.2f GB/s  (cpu %.3f s)\n", write_s, bytes / write_s / 1e9,
              write_cpu);
  std::printf("read   %.3f s  %.2f GB/s  (cpu %.3f s)\n", read_s, bytes / read_s / 1e9, read_cpu);

  NvmeState adam(opt, "pentad-nvme-bench-adamw.state", elements / 2, 2);
  adam.write(0, 0, elements / 2, x.data());
  adam.write(1, 0, elements / 2, x.data() + elements / 2);
  const double moved = 2.0 * double(adam.file_bytes());  // read once, written once
  double t0 = now(), c0 = cpu_s();
  adam.update([](int64_t, int64_t, float* const*) {});
  const double io_s = now() - t0, io_cpu = cpu_s() - c0;
  const NvmeState::Stats before = adam.stats();
  double fn_s = 0;
  t0 = now();
  adam.update([&](int64_t begin, int64_t end, float* const* state) {
    const double f0 = now();
    float* m = state[0];
    float* v = state[1];
    for (int64_t i = 0; i < end - begin; ++i) {
      const float g = 1e-3f * static_cast<float>((begin + i) & 1023);  // a made-up gradient
      m[i] = 0.9f * m[i] + 0.1f * g;
      v[i] = 0.999f * v[i] + 0.001f * g * g;
      m[i] = m[i] / (std::sqrt(v[i]) + 1e-8f) * 1e-9f + m[i];  // the division AdamW pays for
    }
    fn_s += now() - f0;
  });
  const double update_s = now() - t0;
  const NvmeState::Stats after = adam.stats();
  const double wait_s =
      (after.read_wait_s - before.read_wait_s) + (after.write_wait_s - before.write_wait_s);
  const double hidden = std::fmax(0.0, std::fmin(1.0, 1.0 - wait_s / io_s));
  const double hideable = std::fmin(1.0, fn_s / io_s);
  std::printf("update, empty fn   %.3f s  %.2f GB/s (read + written)  (cpu %.3f s)\n", io_s,
              moved / io_s / 1e9, io_cpu);
  std::printf(
      "update, AdamW fn   %.3f s  %.2f GB/s; fn %.3f s, waited %.3f s (read %.3f, "
      "write %.3f); hidden %.0f%% of the I/O (at most %.0f%%)\n",
      update_s, moved / update_s / 1e9, fn_s, wait_s, after.read_wait_s - before.read_wait_s,
      after.write_wait_s - before.write_wait_s, 100 * hidden, 100 * hideable);
  std::printf(
      "RESULT write_gbps=%.3f read_gbps=%.3f update_io_gbps=%.3f update_gbps=%.3f "
      "fn_s=%.3f wait_s=%.3f hidden=%.3f hideable=%.3f host_buffer_mib=%.1f\n",
      bytes / write_s / 1e9, bytes / read_s / 1e9, moved / io_s / 1e9, moved / update_s / 1e9, fn_s,
      wait_s, hidden, hideable, adam.host_buffer_bytes() / 1048576.0);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "pentad_nvme_bench: %s\n", e.what());
  return 1;
}
