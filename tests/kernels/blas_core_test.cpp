// OpenBLAS's kernels for this CPU (kernels/cpu/blas_core.h): the choice of a better kernel
// set. That pentad's processes end up running it is tests/python/blas_core.py's check.
#include "kernels/cpu/blas_core.h"

#include <gtest/gtest.h>

namespace pentad::kernels::cpu {
namespace {

// OpenBLAS's older kernel sets are replaced by the newest the CPU can run; a set it chose
// knowing the CPU stands, as does its choice on a CPU without AVX2.
TEST(BlasCore, OlderKernelsAreReplacedByWhatTheCpuRuns) {
  const CpuVectors avx512{true, true}, avx2{true, false}, neither{};
  EXPECT_EQ(better_blas_core("Prescott", avx512), "SkylakeX");
  EXPECT_EQ(better_blas_core("Prescott", avx2), "Haswell");
  EXPECT_EQ(better_blas_core("Sandybridge", avx2), "Haswell");
  EXPECT_EQ(better_blas_core("Prescott", neither), "");
  for (const char* known : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"}) {
    EXPECT_EQ(better_blas_core(known, avx512), "") << known;
    EXPECT_EQ(better_blas_core(known, avx2), "") << known;
  }
  // What this machine reports is consistent: AVX-512 implies AVX2 and FMA.
  const CpuVectors here = cpu_vectors();
  EXPECT_TRUE(!here.avx512 || here.avx2_fma);
}

}  // namespace
}  // namespace pentad::kernels::cpu
