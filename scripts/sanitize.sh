#!/usr/bin/env bash
# Sanitizer builds and their tests, part of the test command (scripts/test.sh). Each
# builds, in its own directory, only the targets it runs, with the CUDA backend off, at
# -O1 and without -Werror (the main build holds the warnings; GCC's sanitizer builds warn
# falsely inside libstdc++'s <regex>). Both use clang: GCC took 346 s of CPU to build the
# ASan + UBSan targets, clang 197 s (2026-11-28, bench/RESULTS.md).
#   build-asan/  AddressSanitizer + UndefinedBehaviorSanitizer (clang): every CPU unit test
#                program (the slowest model-training cases left to the main build) and
#                short trainings on 2 ranks x 2 threads under mpirun (dp, tp + SP, MoE
#                expert parallelism over dp and folded over tp, context parallelism ring
#                with a resume and Ulysses, ZeRO-3 with NVMe offload, a zb-v pipeline), and the
#                context-parallel attention and ZeRO tests on 4;
#   build-tsan/  ThreadSanitizer (clang, libomp + libarcher), one program (threads_tests):
#                the kernels' tests, the checkpoint saver's background-thread tests and the
#                NVMe engine's (its I/O thread), data prepare's worker, the fault
#                monitor's beat thread and the layout search's threads, on 2 OpenMP threads.
# Findings are fatal. Suppressions (tests/sanitizers/) cover only leaks inside Open MPI's
# own libraries, never pentad code.
#   sanitize.sh [asan|tsan]...              configure, build and run (both when none named)
#   sanitize.sh --build-only [asan|tsan]... configure and build only (scripts/test.sh does
#                                           this beside ctest, at idle priority)
#   sanitize.sh --no-build [asan|tsan]...   run what an earlier --build-only built
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
phase=all
case ${1:-} in
  --build-only) phase=build; shift ;;
  --no-build) phase=run; shift ;;
esac
which=("$@")
((${#which[@]})) || which=(asan tsan)
for kind in "${which[@]}"; do
  [[ $kind == asan || $kind == tsan ]] ||
    { echo "sanitize.sh: unknown kind '$kind' (asan or tsan)" >&2; exit 2; }
done
# The gtest programs ASan runs (one per test folder, tests/CMakeLists.txt).
asan_tests=(core_tests kernels_tests data_tests model_tests recipe_tests plan_tests train_tests checkpoint_tests
  optim_tests pp_tests cli_tests launch_tests)
build() {  # build KIND: configures and builds build-KIND's targets
  case $1 in
    asan)
      CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DPENTAD_CUDA=OFF -DPENTAD_SANITIZE=address -DPENTAD_DRIVER_OPT=-O0 >/dev/null
      cmake --build build-asan -j"$(nproc)" --target pentad parallel_tests \
        "${asan_tests[@]}"
      ;;
    tsan)
      CC=clang CXX=clang++ cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DPENTAD_CUDA=OFF -DPENTAD_SANITIZE=thread >/dev/null
      cmake --build build-tsan -j"$(nproc)" --target threads_tests
      ;;
  esac
}
if [[ $phase != run ]]; then
  for kind in "${which[@]}"; do build "$kind"; done
  [[ $phase == build ]] && exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export PENTAD_POISON=1
# Programs share the cores (run, below): idle OpenMP threads and MPI ranks sleep instead of
# spinning on a core another program could use (scripts/test.sh says what spinning costs).
export OMP_WAIT_POLICY=passive OMPI_MCA_mpi_yield_when_idle=1
# One machine: shared memory and self only (scripts/test.sh says why).
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
# No PCI discovery at each process start (scripts/test.sh says what it costs).
export HWLOC_COMPONENTS=-pci,-linuxio
# Two MPI programs starting at once can race to create Open MPI's session directory
# (scripts/test.sh says how); an mpirun kept alive for the whole run keeps it in place.
mpirun -np 1 sleep 86400 >/dev/null 2>&1 &
keeper=$!
disown "$keeper"  # not one of the programs that run and finish count and wait for
trap 'kill "$keeper" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  compgen -G "${TMPDIR:-/tmp}/ompi.*.$(id -u)/pid.$keeper" >/dev/null && break
  sleep 0.1
done
failed=()

# A sanitizer build must still catch the bug planted for it (tests/sanitizers/
# planted_bugs.cpp), built with the same compiler and flags, and pass the clean variant.
planted() {
  local compiler=$1 flags=$2 bug=$3 words=$4 exe
  exe=$log_dir/planted_bugs
  $compiler -std=c++20 -O1 -g -fopenmp $flags tests/sanitizers/planted_bugs.cpp -o "$exe"
  run "$bug-clean" env OMP_NUM_THREADS=2 "$exe" clean
  if env OMP_NUM_THREADS=2 "$exe" "$bug" >"$log_dir/planted-$bug.log" 2>&1 ||
    ! grep -q "$words" "$log_dir/planted-$bug.log"; then
    echo "sanitize: FAILED: the planted $bug was not reported ($log_dir/planted-$bug.log)"
    failed+=("planted-$bug")
  else
    echo "sanitize: the planted $bug is reported"
  fi
}

# Runs one test program in the background, at most $slots at once (one per core: a
# sanitized program spends much of its run in serial code, so two share two cores well;
# each keeps its own 2 threads or ranks). A failure is recorded, not fatal, so one run
# shows all; finish waits for every program and collects them.
slots=$(nproc)
run() {
  local name=$1
  shift
  while (($(jobs -rp | wc -l) >= slots)); do wait -n || true; done
  (
    SECONDS=0
    if "$@" >"$log_dir/$name.log" 2>&1; then
      echo "sanitize: $name ($SECONDS s)"
    else
      printf 'sanitize: FAILED %s (log: %s)\n%s\n' "$name" "$log_dir/$name.log" \
        "$(tail -40 "$log_dir/$name.log")"
      touch "$log_dir/$name.failed"
    fi
  ) &
}
finish() {
  wait
  local f
  for f in "$log_dir"/*.failed; do
    [[ -e $f ]] && failed+=("$(basename "$f" .failed)")
  done
  return 0
}

for kind in "${which[@]}"; do
  case $kind in
    asan)
      dir=build-asan
      tests=("${asan_tests[@]}")
      # Full stacks for every allocation (fast unwinding stops at the first library built
      # without frame pointers, so suppressions could not see Open MPI in the stack), and
      # Open MPI's plugins kept loaded so their frames still have names at exit.
      export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:strict_string_checks=1:detect_stack_use_after_return=1
      export ASAN_SYMBOLIZER_PATH=$(dirname "$(readlink -f "$(command -v clang++)")")/llvm-symbolizer
      export OMPI_MCA_mca_base_component_disable_dlclose=1
      export LSAN_OPTIONS=suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0
      export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
      log_dir=$dir/sanitize-logs && rm -rf "$log_dir" && mkdir -p "$log_dir"
      planted clang++ "-fsanitize=address,undefined" overflow "heap-buffer-overflow"
      # Training to convergence belongs to the main build: under ASan it takes minutes. So do
      # the planner's wide searches (every --layout pair, the 530B/1T and 70B rows: single-
      # threaded arithmetic the main build runs; 4 minutes at -O0 with ASan).
      # So do the re-planner's searches (Shrink, Replan around a slow link: 24 s under ASan)
      # and the whole fortunes corpus's preparation (14 s; the other Tokenizer and Corpus
      # tests take the tokenizer's training and the preparation through ASan on small texts).
      slow='Training.*OverfitsOneBatch:Training.SameSeed*:*FiniteDifferences*AcrossBlocks'
      slow+=':Plan.EveryLayoutField*:Plan.TheWideHeaded*:Plan.FixedPipelineWith*'
      slow+=':Plan.TheGlobalBatchKeyIsTheSearchsBatch:Shrink.AfterLoss*:Replan.AroundASlowLink*'
      slow+=':Corpus.PreparesTheFortunesOnceAndDecodesBack'
      # So do the default recipe learning the corpus under mpirun (14 s; the asan-train runs
      # below take the binary through mpirun) and every schedule's rounds under NCCL's
      # ordering (10 s of schedule arithmetic; the other Rounds tests run here).
      slow+=':Training.DefaultRecipeLearnsTheCorpusUnderMpirun'
      slow+=':Rounds.EveryScheduleFinishesUnderNcclOrdering'
      # The search on 1 and 4 threads (18 s here): ThreadSanitizer's build runs it.
      slow+=':PlanThreads.*'
      for t in "${tests[@]}"; do
        run "asan-$t" env OMP_NUM_THREADS=2 $dir/tests/$t --gtest_filter="-$slow"
      done
      work=$(mktemp -d)
      run asan-train-dp2 mpirun -np 2 $dir/pentad train recipes/gpt-tiny.toml train.threads=2 \
        train.steps=3 train.eval_every=2 train.save_every=2 train.micro_batch=2 \
        train.seq_len=32 data.source=random train.out_dir="$work/run"
      # 2D tp (1x2: the model width split, the d2 sums in 2 overlapped pieces) with SP; 1D tp
      # + SP runs in asan-train-moe-fold below.
      run asan-train-tp2d-sp mpirun -np 2 $dir/pentad train recipes/llama-tiny.toml train.threads=2 \
        parallel.tp=2 parallel.tp_shape=1x2 parallel.tp_chunks=2 \
        parallel.sequence_parallel=true train.steps=3 train.eval_every=0 \
        train.micro_batch=2 train.seq_len=32 data.source=random train.out_dir="$work/run2"
      # MoE: expert parallelism over dp (capacity drops, the bias update, a checkpoint), and
      # folded over tp + SP with etp (GPT-2 experts, sigmoid routing, a shared expert).
      run asan-train-moe-ep2 mpirun -np 2 $dir/pentad train recipes/llama-tiny.toml \
        train.threads=2 parallel.ep=2 model.moe_layers=all model.n_experts=4 model.top_k=2 \
        moe.aux_loss_coef=0.01 moe.z_loss_coef=0.001 moe.capacity_factor=1.0 \
        moe.bias_update_rate=0.001 train.steps=3 train.eval_every=2 train.save_every=2 \
        train.micro_batch=2 train.seq_len=32 data.source=random train.out_dir="$work/run3"
      run asan-train-moe-fold mpirun -np 2 $dir/pentad train recipes/gpt-tiny.toml \
        train.threads=2 parallel.tp=2 parallel.sequence_parallel=true parallel.ep=2 \
        model.moe_layers=every:2 model.n_experts=4 model.top_k=2 model.n_shared_experts=1 \
        model.d_ff_expert=64 moe.score=sigmoid moe.seq_aux_loss_coef=0.01 train.steps=3 \
        train.eval_every=0 train.micro_batch=2 train.seq_len=32 data.source=random \
        train.out_dir="$work/run4"
      # Context parallelism: each form's attention on 4 ranks, and trainings with the ring
      # (a checkpoint saved and resumed) and with Ulysses (GPT-2's learned positions).
      run asan-context-parallel mpirun -np 4 $dir/tests/parallel_tests \
        --gtest_filter="ContextParallel.*:ContextPositions.*"
      ring_and_resume() {  # the resume reads the first run's checkpoint: one after the other
        mpirun -np 2 $dir/pentad train recipes/llama-tiny.toml train.threads=2 \
          parallel.cp=2 parallel.cp_impl=ring train.steps=3 train.eval_every=2 \
          train.save_every=2 train.micro_batch=2 train.seq_len=32 data.source=random \
          train.out_dir="$work/run5" &&
          mpirun -np 2 $dir/pentad train recipes/llama-tiny.toml --resume latest \
            train.threads=2 parallel.cp=2 parallel.cp_impl=ring train.steps=4 \
            train.eval_every=0 train.micro_batch=2 train.seq_len=32 data.source=random \
            train.out_dir="$work/run5"
      }
      run asan-train-cp2-ring-resume ring_and_resume
      run asan-train-cp2-ulysses mpirun -np 2 $dir/pentad train recipes/gpt-tiny.toml \
        train.threads=2 parallel.cp=2 parallel.cp_impl=ulysses train.steps=3 \
        train.eval_every=2 train.micro_batch=2 train.seq_len=32 data.source=random \
        train.out_dir="$work/run6"
      # Pipelines: zb-v (the backward split into B and W, chunks in a V with the tied head
      # apart, its lists rebuilt from measured passes after step 2) with the timeline written.
      run asan-train-pp2-zb-v mpirun -np 2 $dir/pentad train recipes/gpt-tiny.toml \
        train.threads=2 parallel.pp=2 parallel.pp_schedule=zb-v parallel.virtual_stages=2 \
        model.n_layer=4 train.grad_accum=4 train.steps=4 train.eval_every=0 \
        train.micro_batch=2 train.seq_len=32 data.source=random train.out_dir="$work/run8" \
        --trace "$work/run8/trace.json"
      # ZeRO: shares, uneven collectives, discarded pages; stage 3 with its layer gathers
      # and the NVMe engine's I/O thread.
      run asan-zero mpirun -np 4 $dir/tests/parallel_tests --gtest_filter="Zero.*"
      mkdir -p "$work/offload"
      run asan-train-zero3-nvme mpirun -np 2 $dir/pentad train recipes/gpt-tiny.toml \
        train.threads=2 parallel.zero=3 parallel.offload=nvme \
        parallel.offload_path="$work/offload" parallel.nvme_subgroup_kb=64 train.steps=3 \
        train.eval_every=2 train.micro_batch=2 train.seq_len=32 data.source=random \
        train.out_dir="$work/run7"
      finish
      rm -rf "$work"
      ;;
    tsan)
      dir=build-tsan
      # threads_tests (tests/CMakeLists.txt): the kernels' tests, and the suites that run
      # threads (the saver's and the snapshot's background thread, AdamW's and the NVMe
      # engine's I/O, data prepare's worker, the monitor's beats, the layout search's
      # threads), in two runs side by side.
      threaded='SaverTest.*:CheckpointSnapshot.*:AdamW.*:NvmeStateTest.*:Commands.*:Monitor.*'
      threaded+=':PlanThreads.*'
      # libarcher (an OMPT tool) gives TSan OpenMP's synchronisation; OpenBLAS runs one
      # thread (its OpenMP build links GCC's runtime, which TSan cannot see into).
      export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1"
      export OMP_TOOL_LIBRARIES=$(clang++ -print-resource-dir)/../../libarcher.so
      log_dir=$dir/sanitize-logs && rm -rf "$log_dir" && mkdir -p "$log_dir"
      planted clang++ "-fsanitize=thread -fopenmp=libomp" race "data race"
      tsan=(env OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=1 $dir/tests/threads_tests)
      run tsan-threads "${tsan[@]}" --gtest_filter="$threaded"
      run tsan-kernels "${tsan[@]}" --gtest_filter="-$threaded"
      finish
      ;;
  esac
done

if ((${#failed[@]})); then
  echo "sanitize: ${#failed[@]} failed: ${failed[*]}"
  exit 1
fi
echo "sanitize: all clean (${which[*]})"
