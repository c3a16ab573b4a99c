// OpenBLAS's kernels for this CPU. OpenBLAS picks them by the CPU's model number when it is
// loaded, and a model newer than the library gets its generic Prescott (SSE3) kernels:
// Debian 12's OpenBLAS 0.3.21 on an Emerald Rapids Xeon (family 6, model 207) ran SGEMM at
// 28-35 GFLOP/s a core, against 130-185 with its SkylakeX (AVX-512) kernels
// (bench/RESULTS.md). pentad then asks for the kernels the CPU's features allow, by starting
// itself again with OPENBLAS_CORETYPE set, before anything else has run (MPI included).
#pragma once

#include <string>
#include <string_view>

namespace pentad::kernels::cpu {

// What this CPU and its OS can run, as far as OpenBLAS's single-precision kernels care.
struct CpuVectors {
  bool avx2_fma = false;  // AVX2 and FMA3: OpenBLAS's Haswell kernels
  bool avx512 = false;    // AVX-512 F, CD, BW, DQ and VL: its SkylakeX kernels
};
CpuVectors cpu_vectors();

// The core type to ask OpenBLAS for when it picked `picked` on a CPU with `cpu`: "SkylakeX"
// or "Haswell" where `picked` is one of OpenBLAS's older kernel sets and the CPU has the
// newer one's instructions; empty where its own choice stands (a core it knows: Haswell,
// Zen, SkylakeX, Cooperlake, SapphireRapids; or a CPU without AVX2).
std::string better_blas_core(std::string_view picked, const CpuVectors& cpu);

// The core OpenBLAS picked in this process (openblas_get_corename()).
std::string blas_core();

// At the start of main, before any thread or MPI: where OPENBLAS_CORETYPE is unset and
// better_blas_core() names a core, sets it (and PENTAD_BLAS_REPICKED to what OpenBLAS had
// picked, which also keeps this from running twice) and executes /proc/self/exe again with
// the same arguments. Returns where it does not (the choice stands, or exec failed).
void restart_with_better_blas_core(char** argv);

// A line for the log where OpenBLAS's choice was replaced, in this process or the one that
// started it with the same environment; empty otherwise.
std::string blas_core_note();

}  // namespace pentad::kernels::cpu
