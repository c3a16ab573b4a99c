#!/usr/bin/env bash
# Installs the dependencies (scripts/setup.sh), configures and builds pentad into build/
# (Release, warnings as errors, each floor compiled as one source, all cores).
# PENTAD_CUDA_ARCHITECTURES: the GPUs to compile device code for. Default: the GPUs of this
# machine where nvidia-smi sees one ("native"), else 90 (H100/H200) alone: no source branches
# on the architecture (no __CUDA_ARCH__), so a second one adds compile time and no coverage
# (the attention kernels, then one file: 47 s with two, 21 s with one). One default for scripts/train.sh and
# scripts/test.sh, so either reuses the other's build. The GPU bundle compiles its own.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --build
# The rest of the dependencies install while this compiles (scripts/setup.sh says why).
mkdir -p build
PENTAD_APT_FRESH=1 bash scripts/setup.sh --rest >build/setup-rest.log 2>&1 &
rest=$!
rest_done() {  # waits for the rest's installation; its log when it failed
  wait "$rest" && return 0
  cat build/setup-rest.log >&2
  echo "build.sh: installing the rest of the dependencies failed (build/setup-rest.log)" >&2
  return 1
}
trap 'wait "$rest" 2>/dev/null || true' EXIT  # never leave an apt-get running behind a failure
archs=90
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  archs=native
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPENTAD_WERROR=ON -DPENTAD_UNITY=ON \
  -DPENTAD_CUDA_ARCHITECTURES="${PENTAD_CUDA_ARCHITECTURES:-$archs}" >/dev/null
cmake --build build -j"$(nproc)"
rest_done
