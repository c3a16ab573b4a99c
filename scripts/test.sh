#!/usr/bin/env bash
# The test command: installs dependencies, builds, checks the format (scripts/format_check.sh),
# runs the tests (ctest) while the sanitizer builds compile at idle priority, then the
# sanitizer builds' tests (scripts/sanitize.sh), and prints each stage's time.
#   bash scripts/test.sh          the fast tier: every test but those labelled slow
#   bash scripts/test.sh --full   also the slow tier (ctest -L slow: the ten other layout
#                                 tests' Haswell variants; PENTAD_FULL_TESTS=1 gives the
#                                 script tests their longer forms, e.g. 10 SIGKILL trials)
set -euo pipefail
cd "$(dirname "$0")/.."
full=0
case ${1:-} in
  --full) full=1 ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--full]" >&2; exit 2 ;;
esac
stage_start=$SECONDS
stage() {  # stage NAME: the time since the last stage ended
  echo "test.sh: $1 took $((SECONDS - stage_start)) s"
  stage_start=$SECONDS
}
bash scripts/build.sh  # the same configuration as scripts/train.sh's
stage "setup and build"
bash scripts/format_check.sh  # .clang-format and header top comments; about a second
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Every arena and staging buffer starts as NaN, so a read before the first write fails
# the test that does it instead of depending on what the heap held (core/tensor.h).
export PENTAD_POISON=1
# ctest runs two programs at once on the cores, each with 2 OpenMP threads or MPI ranks. A
# spinning wait (GNU OpenMP's default at a barrier, Open MPI's in a blocking call) then
# holds a core the other program's threads need, and every parallel region costs scheduler
# quanta: Training.Gpt2OverfitsOneBatch took 72 s beside a build, 2.5 s with passive waits.
export OMP_WAIT_POLICY=passive OMPI_MCA_mpi_yield_when_idle=1
# Every rank of the tests runs on this machine, so Open MPI needs two transports, shared
# memory (vader) and self: probing the others (openib, ofi, psm, ucx, tcp) took about 0.2 s of
# every process start. A singleton's daemon took another 0.2 s; pentad and the MPI test
# programs start their singletons without one (launch/rank.h). Together a third of
# checkpoint_resume's 60 s.
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
# Open MPI's hwloc reads every PCI device's configuration space at each process start, to
# place ranks near network cards and GPUs; on a virtual machine each read traps to the
# hypervisor. Shared memory needs no devices: without the PCI and I/O discovery a 4-rank start
# took 280 ms of CPU instead of 450 (perf: 12% of a short run was pci_user_read_config_dword).
export HWLOC_COMPONENTS=-pci,-linuxio
# Open MPI 4.1 creates its per-user session directory (${TMPDIR:-/tmp}/ompi.<host>.<uid>)
# racily: when it does not exist, two MPI processes starting at the same moment (ctest runs
# tests in parallel, several of them MPI singletons) can both try, and the loser fails
# orte_init ("mkdir ... File exists", orte_session_dir failed; seen once in CI as a test
# failing in 0.1 s). The last process to exit removes the directory, so the race comes back
# between tests. An mpirun kept alive for the whole run keeps the directory in place.
mpirun -np 1 sleep 86400 >/dev/null 2>&1 &
keeper=$!
trap 'kill "$keeper" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  compgen -G "${TMPDIR:-/tmp}/ompi.*.$(id -u)/pid.$keeper" >/dev/null && break
  sleep 0.1
done
# The sanitizer builds compile beside ctest at idle priority (SCHED_IDLE: a core goes to
# them only when no test wants it). ctest alone keeps the two cores about 60% busy (its
# serial tail, ranks waiting on each other), and the leftover is most of the sanitizer
# builds' 3.5 minutes: ctest took about 35 s longer, the sanitizer stage 210 s less
# (bench/RESULTS.md). The tests that bound latencies see no competitor at their priority.
idle=(chrt --idle 0)
"${idle[@]}" true 2>/dev/null || idle=(nice -n 19)
"${idle[@]}" bash scripts/sanitize.sh --build-only >build/sanitizer-build.log 2>&1 &
builder=$!
kill_tree() {  # a failed ctest ends the builder and its compilers too
  local child
  for child in $(pgrep -P "$1"); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
trap 'kill "$keeper" 2>/dev/null || true; kill_tree "$builder"' EXIT
if ((full)); then
  export PENTAD_FULL_TESTS=1
  (cd build && ctest -j"$(nproc)" --output-on-failure --timeout 900)
else
  (cd build && ctest -j"$(nproc)" --output-on-failure --timeout 900 -LE slow)
fi
stage ctest
if ! wait "$builder"; then
  tail -40 build/sanitizer-build.log
  echo "test.sh: the sanitizer builds failed (build/sanitizer-build.log)" >&2
  exit 1
fi
stage "the sanitizer builds' remainder"
bash scripts/sanitize.sh --no-build
stage sanitizers
echo "test.sh: all passed in $SECONDS s"
