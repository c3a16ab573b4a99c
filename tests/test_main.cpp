// main() of the GoogleTest programs: OpenBLAS's kernels chosen as pentad's own processes
// choose them (kernels/cpu/blas_core.h), so that the tests run the kernels users run, then
// every test.
#include <gtest/gtest.h>

#include "kernels/cpu/blas_core.h"

int main(int argc, char** argv) {
  pentad::kernels::cpu::restart_with_better_blas_core(argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
