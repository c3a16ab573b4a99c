#include "kernels/cpu/blas_core.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" char* openblas_get_corename(void);  // OpenBLAS's own, beside its cblas.h

namespace pentad::kernels::cpu {

namespace {
constexpr const char* kPicked = "PENTAD_BLAS_REPICKED";
}

CpuVectors cpu_vectors() {
  CpuVectors v;
#if defined(__x86_64__) || defined(__i386__)
  // libgcc's checks include the OS's: the registers are saved on a context switch (XGETBV).
  v.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  v.avx512 = v.avx2_fma && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
  return v;
}

std::string better_blas_core(std::string_view picked, const CpuVectors& cpu) {
  // Kernel sets at least as fast as Haswell's for SGEMM on the CPUs that have them.
  static constexpr std::array<std::string_view, 5> kCurrent = {"Haswell", "Zen", "SkylakeX",
                                                               "Cooperlake", "SapphireRapids"};
  for (std::string_view known : kCurrent)
    if (picked == known) return "";
  if (cpu.avx512) return "SkylakeX";
  if (cpu.avx2_fma) return "Haswell";
  return "";
}

std::string blas_core() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

void restart_with_better_blas_core(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv(kPicked)) return;
  const std::string picked = blas_core();
  const std::string better = better_blas_core(picked, cpu_vectors());
  if (better.empty()) return;
  setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  setenv(kPicked, picked.c_str(), 1);
  execv("/proc/self/exe", argv);
  // Not restarted (no /proc): this process keeps OpenBLAS's own choice, and says so.
  std::fprintf(stderr,
               "pentad: warning: could not restart with OPENBLAS_CORETYPE=%s (%s); "
               "OpenBLAS's %s kernels stay\n",
               better.c_str(), std::strerror(errno), picked.c_str());
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(kPicked);
}

std::string blas_core_note() {
  const char* picked = std::getenv(kPicked);
  if (!picked) return "";
  return fmt::format(
      "OpenBLAS: {} kernels (it picked its generic {} ones for this CPU, whose "
      "model it does not know; set OPENBLAS_CORETYPE to choose)",
      blas_core(), picked);
}

}  // namespace pentad::kernels::cpu
