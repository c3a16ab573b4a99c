// Bugs planted on purpose, so that scripts/sanitize.sh can prove each sanitizer build
// still catches what it is there for (a sanitizer that silently stopped instrumenting
// would otherwise pass every test). usage: planted_bugs race|overflow|clean
#include <omp.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  const char* bug = argc > 1 ? argv[1] : "clean";
  std::vector<double> data(1024, 1.0);
  double sum = 0;
  if (std::strcmp(bug, "race") == 0) {
#pragma omp parallel for num_threads(2)
    for (int i = 0; i < 1024; ++i) sum += data[static_cast<size_t>(i)];  // no reduction
  } else {
#pragma omp parallel for num_threads(2) reduction(+ : sum)
    for (int i = 0; i < 1024; ++i) sum += data[static_cast<size_t>(i)];
  }
  if (std::strcmp(bug, "overflow") == 0) {
    volatile size_t past = data.size();
    sum += data.data()[past];  // one past the end
  }
  std::printf("%g\n", sum);
  return 0;
}
