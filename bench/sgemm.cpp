// The machine's single-precision GEMM rate: OpenBLAS sgemm on square matrices, median
// of several runs after a warm-up. Prints "<FLOP/s> <n> <threads>".
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 2048;
  const int threads = argc > 2 ? std::atoi(argv[2]) : omp_get_num_procs();
  omp_set_num_threads(threads);
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i % 17) * 0.01f;
    b[i] = static_cast<float>(i % 13) * 0.01f;
  }
  std::vector<double> seconds;
  for (int rep = 0; rep < 6; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin() + 1, seconds.end());
  const double median = seconds[1 + (seconds.size() - 1) / 2];
  std::printf("%.4g %d %d\n", 2.0 * n * n * static_cast<double>(n) / median, n, threads);
  return 0;
}
