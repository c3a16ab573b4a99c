// The machine's single-precision GEMM rate: OpenBLAS sgemm on square matrices, median
// of several runs after a warm-up. Prints "<FLOP/s> <n> <threads>".
// With a third argument S: the same GEMM over and over for S seconds, and how steady the
// core is: each run's time (mean, coefficient of variation, least and most) and the mean of
// each half-second, the same work every time (bench/zero_bubble_bench.py: a pass's spread).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

template <class F>
int steadiness(F run, double duration) {
  using clock = std::chrono::steady_clock;
  run();                              // warm-up
  std::vector<double> ms, window_ms;  // each run; each half-second's runs' mean
  double window_sum = 0;
  int window_runs = 0;
  const clock::time_point start = clock::now();
  clock::time_point window = start;
  while (clock::now() - start < std::chrono::duration<double>(duration)) {
    const clock::time_point t0 = clock::now();
    run();
    const clock::time_point t1 = clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    window_sum += ms.back();
    ++window_runs;
    if (t1 - window >= std::chrono::milliseconds(500)) {
      window_ms.push_back(window_sum / window_runs);
      window_sum = 0;
      window_runs = 0;
      window = t1;
    }
  }
  double mean = 0, var = 0;
  for (double x : ms) mean += x / double(ms.size());
  for (double x : ms) var += (x - mean) * (x - mean) / double(ms.size());
  std::printf("%zu runs: mean %.2f ms, cv %.3f, least %.2f, most %.2f; half-second means:",
              ms.size(), mean, std::sqrt(var) / mean, *std::min_element(ms.begin(), ms.end()),
              *std::max_element(ms.begin(), ms.end()));
  for (double w : window_ms) std::printf(" %.1f", w);
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 2048;
  const int threads = argc > 2 ? std::atoi(argv[2]) : omp_get_num_procs();
  omp_set_num_threads(threads);
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i % 17) * 0.01f;
    b[i] = static_cast<float>(i % 13) * 0.01f;
  }
  auto sgemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
  };
  if (argc > 3) return steadiness(sgemm, std::atof(argv[3]));
  std::vector<double> seconds;
  for (int rep = 0; rep < 6; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    sgemm();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin() + 1, seconds.end());
  const double median = seconds[1 + (seconds.size() - 1) / 2];
  std::printf("%.4g %d %d\n", 2.0 * n * n * static_cast<double>(n) / median, n, threads);
  return 0;
}
