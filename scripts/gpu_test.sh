#!/usr/bin/env bash
# The GPU suite, for machines with a CUDA device: builds (scripts/build.sh), then runs every
# CUDA kernel against the CPU reference (the ctest label "gpu": tests/cuda/). Fails when a
# test fails, and also when the tests were skipped (no CUDA device seen) or none ran, so a
# success means they passed on a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
if command -v nvidia-smi >/dev/null; then nvidia-smi -L || true; fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
jobs=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
status=0
# Each test process also runs the CPU reference: two OpenMP threads each.
(cd build && OMP_NUM_THREADS=2 ctest -L gpu -j"$jobs" --output-on-failure --timeout 900) 2>&1 |
  tee "$log" || status=$?

if grep -q "(Skipped)" "$log"; then
  echo "gpu_test: the CUDA tests were skipped: this machine has no CUDA device (or no driver)" >&2
  exit 1
fi
if ! grep -Eq "tests passed, 0 tests failed out of [1-9]" "$log"; then
  echo "gpu_test: the GPU suite did not pass (exit status $status)" >&2
  exit 1
fi
exit "$status"
