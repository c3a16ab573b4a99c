#!/usr/bin/env bash
# The format check (scripts/test.sh runs it after the build; about a second): every tracked
# C++/CUDA file must be as .clang-format (Debian's clang-format 14) would write it, and every
# header of the library folders must open, after #pragma once, with a // comment saying what
# it is for. Prints each file that fails and exits 1; fix formatting with
#   git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | xargs clang-format -i
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format=${CLANG_FORMAT:-clang-format}

mapfile -t sources < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
command -v "$clang_format" >/dev/null || {
  echo "format_check: $clang_format not found (scripts/setup.sh installs it)"
  exit 1
}

# One clang-format run over all of them; it names each offending file as "FILE:LINE:COL: error".
report=$("$clang_format" --dry-run -Werror --ferror-limit=1 "${sources[@]}" 2>&1) && rc=0 || rc=$?
mapfile -t unformatted < <(sed -n 's/^\(.*\):[0-9]*:[0-9]*: error: .*/\1/p' <<<"$report" | sort -u)
if ((rc != 0 && ${#unformatted[@]} == 0)); then  # failed without naming a file: say why
  echo "format_check: $clang_format failed:"
  echo "$report"
  exit 1
fi

# First line that is neither blank nor `#pragma once` must be a // comment.
uncommented=()
mapfile -t headers < <(git ls-files -- {core,src,kernels,parallel,optim,checkpoint,launch}/'*.h' \
  {core,src,kernels,parallel,optim,checkpoint,launch}/'*.cuh')
for f in "${headers[@]}"; do
  first=$(grep -v -e '^#pragma once[[:space:]]*$' -e '^[[:space:]]*$' "$f" | head -n 1 || true)
  [[ $first == //* ]] || uncommented+=("$f")
done

status=0
if ((${#unformatted[@]})); then
  echo "format_check: not formatted by $("$clang_format" --version | head -n 1)" \
    "(fix: clang-format -i FILE...):"
  printf '  %s\n' "${unformatted[@]}"
  status=1
fi
if ((${#uncommented[@]})); then
  echo "format_check: headers without a top // comment (after #pragma once) saying what they are for:"
  printf '  %s\n' "${uncommented[@]}"
  status=1
fi
((status)) || echo "format_check: ${#sources[@]} files formatted, ${#headers[@]} headers commented"
exit "$status"
