#!/usr/bin/env bash
# MoE block forward + backward: pentad against PyTorch on the same cores, then the experts'
# grouped GEMMs against one dense GEMM of the same FLOPs. Runs alternate (pentad, torch,
# pentad, torch, ...) so the machine's noise falls on both; the ratio is of medians.
#
#   bash bench/moe_bench.sh [BUILD_DIR=build] [reps=3]
# Environment: THREADS (2), ITERS per run (10), SHAPES ("C E K F TOKENS;..."), SKEW=1 to
# add skewed-routing block runs.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
reps=${2:-3}
threads=${THREADS:-2}
iters=${ITERS:-10}
python=${PENTAD_PYTHON:-/usr/bin/python3}
bench=$build/pentad_moe_block_bench
[[ -x $bench ]] || { echo "no $bench: cmake --build $build --target pentad_moe_block_bench" >&2; exit 1; }
# recipes/mixtral-tiny.toml's block (8 experts top 2, d_ff_expert 128, micro-batch 8 x 64),
# a mid-size one, and the issue's larger shape.
shapes=${SHAPES:-"64 8 2 128 512;256 8 2 512 1024;512 8 2 1024 2048"}
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads

median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
tps() { awk '/^tokens_per_second/ {print $2}'; }

echo "machine: $(lscpu | awk -F: '/Model name/ {gsub(/^ +/, "", $2); print $2}'), $(nproc) cores," \
  "load $(cut -d' ' -f1-3 /proc/loadavg); commit $(git rev-parse --short HEAD); threads $threads"
skews=0
[[ ${SKEW:-0} == 1 ]] && skews="0 1"
IFS=';' read -ra list <<<"$shapes"
for shape in "${list[@]}"; do
  read -r C E K F N <<<"$shape"
  for skew in $skews; do
    p=() t=()
    for ((r = 0; r < reps; ++r)); do
      p+=("$("$bench" block "$C" "$E" "$K" "$F" "$N" "$threads" "$iters" "$skew" | tps)")
      flag=()
      [[ $skew == 1 ]] && flag=(--skew)
      t+=("$("$python" bench/torch_moe_block.py "$C" "$E" "$K" "$F" "$N" --threads "$threads" \
        --iters "$iters" "${flag[@]}" | tps)")
    done
    pm=$(printf '%s\n' "${p[@]}" | median)
    tm=$(printf '%s\n' "${t[@]}" | median)
    printf 'block C=%s E=%s K=%s F=%s tokens=%s skew=%s: pentad %s tok/s [%s], torch %s tok/s [%s], ratio %.2f\n' \
      "$C" "$E" "$K" "$F" "$N" "$skew" "$pm" "${p[*]}" "$tm" "${t[*]}" "$(echo "$pm / $tm" | bc -l)"
  done
done
for shape in "${list[@]}"; do
  read -r C E K F N <<<"$shape"
  "$bench" gemm "$C" "$E" "$K" "$F" "$N" "$threads" "$((iters * reps))" | sed 's/^/gemm: /'
done
