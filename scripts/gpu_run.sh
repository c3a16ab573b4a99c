#!/usr/bin/env bash
# Runs pentad's GPU checks on a GPU machine that cannot build pentad (no Debian packages, no
# network), from the bundle that scripts/gpu_bundle.sh wrote into .gpu/ on the development
# machine. With the device tool: run(carry [".gpu"], command "bash scripts/gpu_run.sh $OUT").
#   bash scripts/gpu_run.sh OUT_DIR [test|bench|all|multi]
#     test (default): the GPU suite. Runs cuda_kernels_test, cuda_train_test,
#       nccl_comm_test (a one-rank MPI singleton) and device_checkpoint_test side by side, each writing
#       OUT_DIR/gpu_tests/NAME.log and NAME.xml. Fails when a program failed, ran no test, or
#       skipped any (no CUDA device seen), so a success means they passed on a GPU.
#     bench: scripts/gpu_bench.sh on the bundle's binaries (OUT_DIR/gpu_bench.json and
#       OUT_DIR/logs/). When .llmc/ holds llm.c's sources (bench/RESULTS.md) and is carried
#       too, builds llm.c's train_gpt2cu first and benchmarks it beside pentad.
#     all: test, then bench in the time left (one call of the device tool: 10 minutes).
#     multi: the multi-rank suite (ctest's label gpu_multi) with the bundle's mpirun, every
#       rank on this machine, one run at a time: the staged communicator's collectives and
#       stream ordering on device tensors (nccl_comm_test, 2 and 4 ranks), the parallel
#       layouts against one rank (cuda_layout_test, 2, 4 and 8 ranks), ZeRO and MoE against
#       the CPU (2 ranks). With fewer GPUs than ranks (one GPU: all of them) the ranks share
#       them through the staged communicator. OUT_DIR/gpu_multi/NAME.log for each run.
#       GPU_RUN_MULTI: the names of the runs to make, space-separated (all by default);
#       GPU_RUN_ONE_LIMIT_S: seconds one run may take (a rank left waiting for a failed one
#       hangs until then).
# Also writes OUT_DIR/gpu_run_env.txt: the machine, the bundle, the CUDA libraries found.
# Environment: PENTAD_GPU_UNPACK (where to unpack; default /tmp/pentad-gpu-run),
# PENTAD_GPU_CUDA_LIBS (folders holding libcublasLt.so.13, libnccl.so.2, libcudnn.so.9 and
# libnvrtc.so.13, ':'-separated; found by themselves otherwise), GPU_RUN_DEADLINE_S (default 570: the whole call's budget).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${1:?usage: bash scripts/gpu_run.sh OUT_DIR [test|bench|all]}
mode=${2:-test}
case $mode in test | bench | all | multi) ;; *) echo "gpu_run: unknown mode $mode" >&2; exit 2 ;; esac
mkdir -p "$out" && out=$(cd "$out" && pwd)
deadline=$((SECONDS + ${GPU_RUN_DEADLINE_S:-570}))
tarball=.gpu/pentad-gpu.tar.xz
envlog=$out/gpu_run_env.txt
say() { echo "gpu_run: $*"; echo "$*" >>"$envlog"; }
die() { echo "gpu_run: $*" >&2; echo "FAILED: $*" >>"$envlog"; exit 1; }
: >"$envlog"

# ---- unpack ----
[[ -f $tarball ]] || die "no $tarball: run bash scripts/gpu_bundle.sh on the development machine and carry .gpu"
dest=${PENTAD_GPU_UNPACK:-/tmp/pentad-gpu-run}
{ rm -rf "$dest" && mkdir -p "$dest"; } || die "cannot create $dest"
if command -v xz >/dev/null && [[ ${GPU_RUN_NO_XZ:-0} != 1 ]]; then
  tar -xJf "$tarball" -C "$dest" || die "cannot unpack $tarball"
else  # no xz on the machine: python's tarfile reads it
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "$tarball" "$dest" || die "cannot unpack $tarball (no xz; python3 failed too)"
fi
root=$dest/pentad-gpu
say "bundle: $(head -2 "$root/MANIFEST.txt" | tr '\n' ' ')"
say "machine: $(uname -srm); $(ldd --version 2>&1 | head -1)"
if command -v nvidia-smi >/dev/null; then
  say "nvidia-smi: $(nvidia-smi -L 2>&1 | head -4 | tr '\n' ' ')"
else
  say "nvidia-smi: not found"
fi

# ---- CUDA's libraries on this machine: cuBLASLt, NCCL, cuDNN and NVRTC ----
# Looked for in PENTAD_GPU_CUDA_LIBS, the CUDA toolkit, python's nvidia-* packages (where
# PyTorch's CUDA 13 wheels keep them: cuDNN in nvidia-cudnn-cu13), then ld.so's cache.
# libcudnn.so.9 loads its engine libraries (libcudnn_graph.so.9, ...) from the same folder.
search=()
IFS=: read -r -a search <<<"${PENTAD_GPU_CUDA_LIBS:-}"
search+=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib)
while IFS= read -r d; do
  [[ -d $d/nvidia ]] && while IFS= read -r l; do search+=("$l"); done < <(
    find "$d/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null | sort)
done < <(python3 -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null | sort -u)
find_lib() {  # find_lib SONAME: prints the folder that holds it, or nothing
  local d
  for d in "${search[@]}"; do
    [[ -n $d && -e $d/$1 ]] && { echo "$d"; return; }
  done
  ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n {print $NF; exit}' | xargs -r dirname
}
cuda_dirs=()
for lib in libcublasLt.so.13 libnccl.so.2 libcudnn.so.9 libnvrtc.so.13; do
  d=$(find_lib "$lib")
  [[ -n $d ]] || die "$lib is not on this machine (looked in ${search[*]} and ld.so's cache)"
  say "$lib: $d/$lib -> $(readlink -f "$d/$lib")"
  [[ " ${cuda_dirs[*]} " == *" $d "* ]] || cuda_dirs+=("$d")
done
d=$(find_lib libcuda.so.1)
say "libcuda.so.1 (the driver): ${d:-not found in the usual places; left to ld.so}"
PENTAD_GPU_CUDA_LIBS=$(IFS=:; echo "${cuda_dirs[*]}")
export PENTAD_GPU_CUDA_LIBS

# ---- can the bundled programs load? ----
check_load() {  # prints ldd's complaints for every bundled program, with the bundle's env
  # shellcheck source=/dev/null
  (PENTAD_GPU_ENV=$root/env.sh && . "$PENTAD_GPU_ENV" &&
    for b in "$root"/bin/*; do ldd "$b" 2>&1 | grep -E "not found|version .* not found" | sed "s|^|$(basename "$b"): |"; done)
}
problems=$(check_load)
if grep -q "GLIBCXX\|CXXABI\|GCC_" <<<"$problems" && ! grep -q "GLIBC_[0-9]" <<<"$problems"; then
  say "this machine's libstdc++ is older than the build's: using the bundle's"
  export PENTAD_GPU_LIBSTDCXX=1
  problems=$(check_load)
fi
[[ -z $problems ]] || die "the bundled programs cannot load here:
$problems"
# shellcheck source=/dev/null
(PENTAD_GPU_ENV=$root/env.sh && . "$PENTAD_GPU_ENV" && ldd "$root/bin/nccl_comm_test") >>"$envlog" 2>&1
"$root/build/pentad" --help >/dev/null 2>>"$envlog" || die "the bundled pentad does not start (see $envlog)"

# ---- the GPU suite ----
run_tests() {
  local dir=$out/gpu_tests names=(cuda_kernels_test cuda_train_test nccl_comm_test device_checkpoint_test) n pids=()
  local limit=$((deadline - SECONDS - 20)) status=0 rc passed skipped failed
  mkdir -p "$dir"
  ((limit > 60)) || { echo "gpu_run: no time left for the GPU suite" >&2; return 1; }
  ((limit > 540)) && limit=540
  echo "gpu_run: the GPU suite (${names[*]}), side by side, $limit s at most"
  for n in "${names[@]}"; do
    # Each program also runs the CPU reference: a few OpenMP threads each.
    OMP_NUM_THREADS=${GPU_RUN_THREADS:-4} timeout -k 10 "$limit" "$root/build/$n" \
      --gtest_output="xml:$dir/$n.xml" >"$dir/$n.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!names[@]}"; do
    n=${names[$i]}
    wait "${pids[$i]}"
    rc=$?
    passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\?\..*/\1/p' "$dir/$n.log" | tail -1)
    # gtest names each skipped or failed test twice (as it runs, then in the list at the end)
    skipped=$(grep '^\[  SKIPPED \] [A-Za-z]' "$dir/$n.log" | awk '{print $4}' | sort -u | grep -c .)
    failed=$(grep '^\[  FAILED  \] [A-Za-z]' "$dir/$n.log" | awk '{print $4}' | sort -u | grep -c .)
    echo "gpu_run: $n: exit $rc, ${passed:-0} passed, $skipped skipped, $failed failed (log: $dir/$n.log)" |
      tee -a "$dir/summary.txt"
    if ((rc != 0 || failed > 0)); then
      status=1
      grep -E '^\[  FAILED  \]|Failure|error' "$dir/$n.log" | head -20
      ((rc == 124 || rc == 137)) && echo "gpu_run: $n ran past its $limit s"
    elif ((skipped > 0)); then
      status=1
      echo "gpu_run: $n skipped tests: this machine has no CUDA device (or no driver) that it can use" >&2
      grep -m3 -B2 '^\[  SKIPPED \]' "$dir/$n.log" | head -8
    elif ((${passed:-0} == 0)); then
      status=1
      echo "gpu_run: $n ran no test" >&2
    fi
  done
  if ((status == 0)); then echo "gpu_run: the GPU suite passed" | tee -a "$dir/summary.txt"
  else echo "gpu_run: the GPU suite did not pass" | tee -a "$dir/summary.txt" >&2; fi
  return "$status"
}

# ---- the multi-rank suite ----
# One run: NAME RANKS BINARY [ARGS...]; passes when it exits 0 having passed tests and
# skipped none. The same runs as tests/cuda/CMakeLists.txt's gpu_multi ctests, in the order
# that puts the cheapest first.
run_multi_one() {
  local name=$1 ranks=$2 bin=$3 dir=$out/gpu_multi rc passed skipped failed limit oks
  shift 3
  limit=$((deadline - SECONDS - 10))
  ((limit > 30)) || { echo "gpu_run: $name: no time left" | tee -a "$dir/summary.txt"; return 1; }
  # GPU_RUN_ONE_LIMIT_S: at most this long a run (a rank left waiting for a failed one hangs).
  [[ -n ${GPU_RUN_ONE_LIMIT_S:-} ]] && ((limit > GPU_RUN_ONE_LIMIT_S)) && limit=$GPU_RUN_ONE_LIMIT_S
  if [[ -n ${GPU_RUN_MULTI:-} && " $GPU_RUN_MULTI " != *" $name "* ]]; then
    echo "gpu_run: $name: not in GPU_RUN_MULTI" | tee -a "$dir/summary.txt"
    return 0
  fi
  local start=$SECONDS
  OMP_NUM_THREADS=${GPU_RUN_THREADS:-2} timeout -k 10 "$limit" "$root/build/orterun" \
    -np "$ranks" "$root/build/$bin" --gtest_color=no "$@" >"$dir/$name.log" 2>&1
  rc=$?
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\?\..*/\1/p' "$dir/$name.log" | tail -1)
  skipped=$(grep '^\[  SKIPPED \] [A-Za-z]' "$dir/$name.log" | awk '{print $4}' | sort -u | grep -c .)
  failed=$(grep '^\[  FAILED  \] [A-Za-z]' "$dir/$name.log" | awk '{print $4}' | sort -u | grep -c .)
  oks=$(grep -c '^\[       OK \]' "$dir/$name.log")
  echo "gpu_run: $name: exit $rc, $oks ok, ${passed:-0} passed, $skipped skipped, $failed failed," \
    "$((SECONDS - start)) s (log: $dir/$name.log)" | tee -a "$dir/summary.txt"
  if ((rc != 0 || failed > 0 || skipped > 0 || ${passed:-0} == 0)); then
    grep -E '^\[  FAILED  \]|^\[  SKIPPED \]|Failure|error' "$dir/$name.log" | head -20
    return 1
  fi
}

run_multi() {
  local dir=$out/gpu_multi status=0
  mkdir -p "$dir"
  : >"$dir/summary.txt"
  echo "gpu_run: the multi-rank suite, one run at a time"
  local staged=(--gtest_filter='DTypes/NcclCollective.*:NcclStreams.KernelsAndCollectives*')
  PENTAD_COMM_TEST_BACKEND=staged run_multi_one nccl_comm_test_staged_np2 2 nccl_comm_test "${staged[@]}" || status=1
  PENTAD_COMM_TEST_BACKEND=staged run_multi_one nccl_comm_test_staged_np4 4 nccl_comm_test "${staged[@]}" || status=1
  for ranks in 2 4 8; do
    run_multi_one "cuda_layout_test_np$ranks" "$ranks" cuda_layout_test "--gtest_filter=*np$ranks" || status=1
  done
  run_multi_one cuda_zero_test_np2 2 cuda_zero_test || status=1
  run_multi_one cuda_moe_test_np2 2 cuda_moe_test || status=1
  if ((status == 0)); then echo "gpu_run: the multi-rank suite passed" | tee -a "$dir/summary.txt"
  else echo "gpu_run: the multi-rank suite did not pass" | tee -a "$dir/summary.txt" >&2; fi
  return "$status"
}

# ---- the benchmark ----
run_bench() {
  local llmc=${GPU_BENCH_LLMC:-}
  mkdir -p "$out/logs"
  if [[ -z $llmc && -f .llmc/train_gpt2.cu && ${GPU_BENCH_SMOKE:-0} != 1 ]]; then
    echo "gpu_run: building llm.c's train_gpt2cu (log: $out/logs/build.log)"
    if (cd .llmc && LIBRARY_PATH=/usr/local/cuda/lib64/stubs timeout 240 make train_gpt2cu \
      NO_OMP=1 NO_MULTI_GPU=1 NO_USE_MPI=1 USE_CUDNN=0 GPU_COMPUTE_CAPABILITY=90) \
      >"$out/logs/build.log" 2>&1; then
      llmc=.llmc/train_gpt2cu
    else
      echo "gpu_run: llm.c did not build; the end of its log:" >&2
      tail -15 "$out/logs/build.log" >&2
    fi
  fi
  GPU_BENCH_SKIP_BUILD=1 PENTAD_BUILD_DIR=$root/build GPU_BENCH_LLMC=$llmc \
    PENTAD_COMMIT=${PENTAD_COMMIT:-$(cat "$root/COMMIT")} \
    GPU_BENCH_DEADLINE_S=$((deadline - SECONDS)) \
    bash scripts/gpu_bench.sh "$out/gpu_bench.json" "$out/logs"
}

status=0
case $mode in
  test) run_tests || status=1 ;;
  bench) run_bench || status=1 ;;
  multi) run_multi || status=1 ;;
  all)
    run_tests || status=1
    run_bench || status=1
    ;;
esac
exit "$status"
