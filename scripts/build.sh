#!/usr/bin/env bash
# Configures and builds pentad into build/ (Release, warnings as errors, all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPENTAD_WERROR=ON >/dev/null
cmake --build build -j"$(nproc)"
