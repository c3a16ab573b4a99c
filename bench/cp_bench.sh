#!/usr/bin/env bash
# Context parallelism on CPU ranks, three measurements (bench/RESULTS.md, "context
# parallelism"):
#   1. the cp groups' bytes per step from the communication trace against the formulas
#      (bench/cp_comm_volume.py; fails past 5%);
#   2. step time and per-rank activation memory at long sequences under cp 1, 2, 4
#      (bench/cp_scaling.py);
#   3. how much of the ring's K/V transfer time hides behind the blocks' attention
#      (pentad_cp_bench under mpirun -np 2 and 4, on shared memory and on a simulated slow
#      link).
#
#   bash bench/cp_bench.sh [BUILD_DIR=build]
# Environment: STEPS (4) for 2; SCALING_RUNS to override 2's seq:cp:impl list; T (8192),
# HEADS ("8 4 16": H HKV D), ITERS (5) and LINK_MIB_S (20) for 3.
# Needs: cmake --build BUILD_DIR --target pentad pentad_cp_bench, and Open MPI's mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
python=${PENTAD_PYTHON:-/usr/bin/python3}
for exe in pentad pentad_cp_bench; do
  [[ -x $build/$exe ]] || { echo "no $build/$exe: cmake --build $build --target $exe" >&2; exit 1; }
done
echo "machine: $(lscpu | awk -F: '/Model name/ {gsub(/^ +/, "", $2); print $2}'), $(nproc --all) cores," \
  "load $(cut -d' ' -f1-3 /proc/loadavg); commit $(git rev-parse --short HEAD)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
seq_len=${T:-8192}
read -r H HKV D <<<"${HEADS:-8 4 16}"
iters=${ITERS:-5}
link=${LINK_MIB_S:-20}

echo "== 1. communication volume"
"$python" bench/cp_comm_volume.py --pentad "$build/pentad"

echo "== 2. step time and memory"
"$python" bench/cp_scaling.py --pentad "$build/pentad" --steps "${STEPS:-4}" \
  ${SCALING_RUNS:+--runs "$SCALING_RUNS"}

echo "== 3. ring overlap"
for np in 2 4; do
  for rate in 0 "$link"; do
    echo "\$ mpirun --oversubscribe -np $np $build/pentad_cp_bench $seq_len $H $HKV $D $iters 1 1 $rate"
    mpirun --oversubscribe -np "$np" "$build/pentad_cp_bench" "$seq_len" "$H" "$HKV" "$D" \
      "$iters" 1 1 "$rate"
  done
done
