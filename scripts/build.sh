#!/usr/bin/env bash
# Configures and builds pentad into build/ (Release, warnings as errors, each floor compiled
# as one source, all cores).
# PENTAD_CUDA_ARCHITECTURES: the GPUs to compile device code for (default A100 and
# H100/H200).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPENTAD_WERROR=ON -DPENTAD_UNITY=ON \
  -DPENTAD_CUDA_ARCHITECTURES="${PENTAD_CUDA_ARCHITECTURES:-80;90}" >/dev/null
cmake --build build -j"$(nproc)"
