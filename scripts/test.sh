#!/usr/bin/env bash
# The test command: installs dependencies, builds, checks the format (scripts/format_check.sh),
# runs every test (ctest), then the sanitizer builds' tests (scripts/sanitize.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
bash scripts/format_check.sh  # .clang-format and header top comments; about a second
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Every arena and staging buffer starts as NaN, so a read before the first write fails
# the test that does it instead of depending on what the heap held (core/tensor.h).
export PENTAD_POISON=1
(cd build && ctest -j"$(nproc)" --output-on-failure --timeout 900)
bash scripts/sanitize.sh
