#!/usr/bin/env bash
# The main job: installs dependencies, builds, and trains the default recipe (gpt-tiny) on
# the bundled fortune-cookie corpus under mpirun on 8 ranks: pipeline 2 (1F1B over 4
# micro-batches) x data parallel 2 x tensor parallel 2 with sequence parallelism, the same
# global batch as one rank with micro_batch 16. Writes the pipeline timeline next to the
# metrics. Extra arguments are recipe overrides (key=value).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."  # the checkout, also when called through a link
bash scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p runs/gpt-tiny
mpirun --oversubscribe -np 8 build/pentad train recipes/gpt-tiny.toml \
  parallel.pp=2 parallel.tp=2 parallel.sequence_parallel=true \
  train.micro_batch=2 train.grad_accum=4 --trace runs/gpt-tiny/pipeline-trace.json "$@"
