#!/usr/bin/env bash
# The main job: installs dependencies, builds, and trains the default recipe on the
# bundled corpus under mpirun. Extra arguments are recipe overrides (section.key=value).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun -np 1 build/pentad train recipes/gpt-tiny.toml "$@"
