#!/usr/bin/env bash
# Installs every dependency pentad needs from Debian. Idempotent: when everything is
# present it only runs dpkg queries and returns in well under a second.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  clang libomp-dev libclang-rt-dev    # ThreadSanitizer build (libarcher: OpenMP for TSan)
  openmpi-bin libopenmpi-dev          # communicators (MPI backend)
  libhdf5-dev libxxhash-dev zlib1g-dev  # checkpoints (HDF5 files, xxh3 and crc32 checksums)
  libspdlog-dev libfmt-dev            # logging
  libgtest-dev                        # tests
  libtomlplusplus-dev                 # recipes
  libcli11-dev                        # command line
  libopenblas-openmp-dev              # CPU GEMM, sharing the OpenMP thread pool
  liburing-dev                        # NVMe offload
  nlohmann-json3-dev                  # tokenizer.json, metrics
  python3-torch python3-numpy         # numerical reference in tests and benchmarks
  python3-pip                         # for safetensors below
  fortunes                            # default English corpus
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Hugging Face export test reads model.safetensors with the `safetensors` package,
# which Debian does not ship: take it from PyPI for the system interpreter (which has torch).
if ! /usr/bin/python3 -c "import safetensors" 2>/dev/null; then
  echo "setup: installing safetensors from PyPI"
  /usr/bin/python3 -m pip install --quiet --break-system-packages safetensors
fi
