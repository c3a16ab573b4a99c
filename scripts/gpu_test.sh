#!/usr/bin/env bash
# The GPU suite, for machines with a CUDA device: builds (scripts/build.sh), then runs the
# ctest label "gpu" (tests/cuda/): every CUDA kernel against the CPU reference, and whole
# training steps through the Trainer on the GPU (fp32 and bf16) against the CPU. Fails when
# a test fails, and also when the tests were skipped (no CUDA device seen) or none ran, so a
# success means they passed on a GPU. Then the label "gpu_multi": the tests over 2 to 8 ranks
# under mpirun (the staged communicator's collectives on device tensors, the parallel layouts
# against one rank, ZeRO and MoE against the CPU), one at a time; with fewer GPUs than ranks
# (one GPU: all of them) the ranks share them through the staged communicator.
# PENTAD_GPU_MULTI=0 leaves them out.
#   bash scripts/gpu_test.sh [LOG]     (LOG: keep ctest's whole output there, e.g. in $OUT)
# On a GPU machine without pentad's Debian packages (the device tool's), use the bundle
# instead: scripts/gpu_bundle.sh here, then scripts/gpu_run.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
if command -v nvidia-smi >/dev/null; then nvidia-smi -L || true; fi
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "${PENTAD_COMMIT:-unknown}")
echo "gpu_test: commit $commit"

if [[ $# -ge 1 ]]; then
  log=$1
  mkdir -p "$(dirname "$log")"
else
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
fi
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
((status == 0)) || exit "$status"
[[ ${PENTAD_GPU_MULTI:-1} == 1 ]] || exit 0

# Each test takes every rank's share of the GPU and the cores: one at a time.
multi_log=$log.multi
(cd build && OMP_NUM_THREADS=2 ctest -L gpu_multi -j1 --output-on-failure --timeout 900) 2>&1 |
  tee "$multi_log" || status=$?
if grep -q "(Skipped)" "$multi_log" || ! grep -Eq "tests passed, 0 tests failed out of [1-9]" "$multi_log"; then
  echo "gpu_test: the multi-rank suite (gpu_multi) did not pass (exit status $status)" >&2
  exit 1
fi
exit "$status"
