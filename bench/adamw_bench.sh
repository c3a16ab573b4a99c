#!/usr/bin/env bash
# The host AdamW's update rate against torch.optim.AdamW on the same threads (bench/RESULTS.md,
# "host AdamW update rate"). Builds nothing: runs pentad_adamw_bench and bench/torch_adamw.py
# alternately (A B A B ...), then prints each figure's median over the rounds, pentad's rate
# over each torch variant's, and what pentad's 28 bytes per element reach of the bandwidth
# measured in the same program.
#
#   bash bench/adamw_bench.sh [BUILD_DIR=build]
# Environment: ROUNDS (3), THREADS (2), ELEMENTS (100000000), REPS (20) per figure and round.
# Needs: cmake --build BUILD_DIR --target pentad_adamw_bench; Debian's python3-torch.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
python=${PENTAD_PYTHON:-/usr/bin/python3}
rounds=${ROUNDS:-3}
elements=${ELEMENTS:-100000000}
reps=${REPS:-20}
export OMP_NUM_THREADS=${THREADS:-2}
exe=$build/pentad_adamw_bench
[[ -x $exe ]] || { echo "no $exe: cmake --build $build --target pentad_adamw_bench" >&2; exit 1; }
echo "machine: $(lscpu | awk -F: '/Model name/ {gsub(/^ +/, "", $2); print $2}'), $(nproc --all) cores," \
  "avx512f: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no)," \
  "load $(cut -d' ' -f1-3 /proc/loadavg); commit $(git rev-parse --short HEAD)"

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for ((round = 1; round <= rounds; ++round)); do
  echo "== round $round of $rounds, load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "\$ OMP_NUM_THREADS=$OMP_NUM_THREADS $exe $elements $reps"
  "$exe" "$elements" "$reps" | tee -a "$results"
  echo "\$ $python bench/torch_adamw.py --elements $elements --reps $reps --threads $OMP_NUM_THREADS"
  "$python" bench/torch_adamw.py --elements "$elements" --reps "$reps" \
    --threads "$OMP_NUM_THREADS" | tee -a "$results"
done

echo "== medians over $rounds rounds"
"$python" - "$results" <<'EOF'
import statistics
import sys

figures = {}  # key (the words between RESULT and the value) -> values, one per round
for line in open(sys.argv[1]):
    if line.startswith("RESULT "):
        *key, value = line.split()[1:]
        figures.setdefault(tuple(key), []).append(float(value))
med = {k: statistics.median(v) for k, v in figures.items()}
triad = med[("triad", "bytes_per_second")]
print(f"triad {triad / 1e9:.2f} GB/s (STREAM's 12 bytes per element; 16 move with write-allocate)")
for layout in ("flat", "gpt2"):
    rate = med.get((layout, "params_per_second"))
    if rate is None:
        continue
    same_rw = med[(layout, "same_rw_bytes_per_second")]
    print(f"{layout}: pentad {rate / 1e9:.3f} G params/s = {28 * rate / 1e9:.2f} GB/s "
          f"({28 * rate / same_rw:.0%} of same-rw {same_rw / 1e9:.2f} GB/s); pentad's rounds: "
          + " ".join(f"{r / 1e9:.3f}" for r in figures[(layout, "params_per_second")]))
    torch = {key[1]: r for key, r in med.items() if len(key) == 3 and key[0] == layout}
    for name, torch_rate in torch.items():
        rounds = " ".join(f"{r / 1e9:.3f}" for r in figures[(layout, name, "params_per_second")])
        print(f"  torch {name:8s} {torch_rate / 1e9:.3f} G params/s = {28 * torch_rate / 1e9:5.2f} "
              f"GB/s at 28 B (rounds {rounds}): pentad / torch = {rate / torch_rate:.2f}x")
    if torch:
        name = max(torch, key=torch.get)
        print(f"  against the fastest torch ({name}): {rate / torch[name]:.2f}x")
EOF
