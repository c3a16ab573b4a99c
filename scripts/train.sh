#!/usr/bin/env bash
# The main job: installs dependencies, builds, and trains the default recipe (gpt-tiny) on
# the bundled fortune-cookie corpus under mpirun on 4 ranks: data parallel 2 x tensor
# parallel 2 with sequence parallelism. Extra arguments are recipe overrides (key=value).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun --oversubscribe -np 4 build/pentad train recipes/gpt-tiny.toml \
  parallel.tp=2 parallel.sequence_parallel=true "$@"
