#!/usr/bin/env bash
# Line and branch coverage of the test command's fast tier, per top-level folder (and per
# folder of src/): builds with gcov's counters into build-cov/ (CPU backend, -O1), runs the
# same ctest as scripts/test.sh there, and summarises with gcovr (Debian's). About as long
# as the test command's build and ctest stages.
#   bash scripts/coverage.sh           the fast tier's table (build-cov/coverage.json)
#   bash scripts/coverage.sh --full    then the slow tier on top, and its table: what the
#                                      slow tier adds (build-cov/coverage-full.json)
set -euo pipefail
cd "$(dirname "$0")/.."
full=0
[[ ${1:-} == --full ]] && full=1
bash scripts/setup.sh
if ! dpkg-query -W -f='${Status}' gcovr 2>/dev/null | grep -q "install ok installed"; then
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends gcovr
fi
cmake -S . -B build-cov -G Ninja -DCMAKE_BUILD_TYPE=Release -DPENTAD_CUDA=OFF \
  -DPENTAD_COVERAGE=ON >/dev/null
cmake --build build-cov -j"$(nproc)"
find build-cov -name '*.gcda' -delete
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export PENTAD_POISON=1 OMP_WAIT_POLICY=passive OMPI_MCA_mpi_yield_when_idle=1
# One machine: shared memory and self only, no singleton daemon (scripts/test.sh says why).
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
mpirun -np 1 sleep 86400 >/dev/null 2>&1 &  # scripts/test.sh says why
keeper=$!
trap 'kill "$keeper" 2>/dev/null || true' EXIT
# Failures do not stop the summary (a failing test still covers what it ran), but say so.
summary() {  # summary JSON: gcovr over every counter so far, then the table
  gcovr --root . --object-directory build-cov \
    --filter '(core|kernels|parallel|optim|checkpoint|launch|src)/' --exclude 'tests/' \
    --json-summary "$1" --json-summary-pretty -j "$(nproc)" >/dev/null
  python3 - "$1" <<'PY'
import json, sys
from collections import defaultdict
doc = json.load(open(sys.argv[1]))
rows = defaultdict(lambda: [0, 0, 0, 0])  # lines covered, lines, branches covered, branches
for f in doc["files"]:
    parts = f["filename"].split("/")
    folder = "/".join(parts[:2]) if parts[0] == "src" else parts[0]
    r = rows[folder]
    r[0] += f["line_covered"]; r[1] += f["line_total"]
    r[2] += f["branch_covered"]; r[3] += f["branch_total"]
pct = lambda a, b: f"{100.0 * a / b:5.1f}%" if b else "    -"
print(f"| folder | lines | of | branches | of |")
print(f"|---|---:|---:|---:|---:|")
total = [0, 0, 0, 0]
for folder in sorted(rows):
    r = rows[folder]
    total = [t + x for t, x in zip(total, r)]
    print(f"| {folder} | {pct(r[0], r[1])} | {r[1]} | {pct(r[2], r[3])} | {r[3]} |")
print(f"| all | {pct(total[0], total[1])} | {total[1]} | {pct(total[2], total[3])} | {total[3]} |")
PY
}
(cd build-cov && ctest -j"$(nproc)" --timeout 900 --output-on-failure -LE slow) ||
  echo "coverage: some tests failed; the figures below count what ran"
echo "coverage of the fast tier (scripts/test.sh):"
summary build-cov/coverage.json
if ((full)); then
  (cd build-cov && PENTAD_FULL_TESTS=1 ctest -j"$(nproc)" --timeout 900 --output-on-failure \
    -L slow) || echo "coverage: some slow tests failed"
  # The script tests' longer forms too (PENTAD_FULL_TESTS: e.g. more SIGKILL trials).
  (cd build-cov && PENTAD_FULL_TESTS=1 ctest -j"$(nproc)" --timeout 900 -R checkpoint_resume) ||
    echo "coverage: checkpoint_resume failed"
  echo "coverage with the slow tier added (scripts/test.sh --full):"
  summary build-cov/coverage-full.json
fi
