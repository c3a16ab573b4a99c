#!/usr/bin/env bash
# Installs every dependency pentad needs from Debian. Idempotent: when everything is
# present it only runs dpkg queries and returns in well under a second.
#   setup.sh          everything
#   setup.sh --build  what compiling pentad needs (the libraries, and the cuDNN frontend's
#                     headers in .venv); the apt index is refreshed here when anything at all
#                     is missing
#   setup.sh --rest   the rest: the tests' tools (clang's sanitizers, Slurm, torch), the corpus,
#                     the transformers environment. scripts/build.sh runs it while it compiles:
#                     on a fresh machine the downloads and unpacking (about 90 s) then cost
#                     the build little, since compiling waits on the CPU and they on the network
#                     and the disk. PENTAD_APT_FRESH=1: the index was just refreshed.
set -euo pipefail
part=all
case ${1:-} in
  --build) part=build ;;
  --rest) part=rest ;;
  "") ;;
  *) echo "usage: scripts/setup.sh [--build | --rest]" >&2; exit 2 ;;
esac

build_packages=(
  build-essential cmake ninja-build pkg-config
  openmpi-bin libopenmpi-dev          # communicators (MPI backend)
  libhdf5-dev libxxhash-dev zlib1g-dev  # checkpoints (HDF5 files, xxh3 and crc32 checksums)
  libzstd-dev                         # zstd-compressed inputs of data prepare
  libspdlog-dev libfmt-dev            # logging
  libgtest-dev                        # tests
  libtomlplusplus-dev                 # recipes
  libcli11-dev                        # command line
  libopenblas-openmp-dev              # CPU GEMM, sharing the OpenMP thread pool
  liburing-dev                        # NVMe offload
  nlohmann-json3-dev                  # tokenizer.json, metrics
  libpcre2-dev libsentencepiece-dev   # tokenizers: pre-tokenizer regexes, SentencePiece models
  python3-venv python3-pip            # the environment below (the cuDNN frontend's headers)
)
rest_packages=(
  clang llvm libomp-dev libclang-rt-dev  # sanitizer builds: TSan with libarcher (OpenMP
                                        # for TSan), llvm-symbolizer for their stacks
  slurmctld slurmd slurm-client       # tests/launch/slurm_srun.py: a one-node Slurm (srun)
  slurm-wlm-basic-plugins libpmix-dev  # srun --mpi=pmix: Slurm's plugin loads libpmix.so
                                       # (unversioned, from -dev), the PMIx Open MPI uses
  zstd                                # the tool data prepare's test compresses with
  clang-format                        # scripts/format_check.sh (Debian 14; .clang-format)
  python3-torch python3-numpy         # numerical reference in tests and benchmarks
  python3-matplotlib                  # pentad plot (scripts/plot_curves.py)
  fortunes                            # default English corpus
  procps util-linux                   # scripts/test.sh: pgrep, chrt; unshare (scripts/hosts.sh)
  iproute2                            # scripts/hosts.sh: ip netns, veth, bridge, tc
)
case $part in
  all) packages=("${build_packages[@]}" "${rest_packages[@]}") ;;
  build) packages=("${build_packages[@]}") ;;
  rest) packages=("${rest_packages[@]}") ;;
esac

missing_of() {  # missing_of PACKAGE...: those not installed
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
mapfile -t missing < <(missing_of "${packages[@]}")
update=0
if ((${#missing[@]})); then
  [[ $part == rest && ${PENTAD_APT_FRESH:-0} == 1 ]] || update=1
elif [[ $part == build ]] && [[ -n $(missing_of "${rest_packages[@]}") ]]; then
  update=1  # once, here: the rest installs beside the build from the same index
fi
sudo_cmd=()
[[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
((update)) && "${sudo_cmd[@]}" apt-get update -qq
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Hugging Face tests load pentad's exports with the real transformers library (and
# read safetensors files), which Debian does not ship. They go into a virtual environment
# that also sees Debian's torch and numpy (--system-site-packages); tests/scripts.cmake runs
# those tests with its python (.venv/bin/python); the tokenizer test trains references with
# tokenizers and sentencepiece (0.1.99: the closest wheel to Debian's libsentencepiece
# 0.1.97, which pentad links). transformers 4.40 is the newest that runs on Debian's torch
# 1.13; its dependencies are pinned to versions checked with it. The TensorBoard test reads
# pentad's event files with the tensorboard package's own reader, from the same environment.
# The cuDNN frontend's C++ headers (the graph API behind train.attention = "cudnn") come from
# its wheel too: header-only, needed at build time only, found in site-packages by
# cmake/cudnn.cmake (the wheel's python bindings are never imported).
#
# One environment serves every checkout with the same pins (clones, worktrees): it is built
# once (about 45 s) in ${PENTAD_VENV_CACHE:-~/.cache/pentad}/venv-<hash of the pins and the
# python>, under a lock, and .venv links to it.
root="$(cd "$(dirname "$0")/.." && pwd)"
hf_pins=(transformers==4.40.2 tokenizers==0.19.1 huggingface-hub==0.36.2 safetensors==0.8.0
         sentencepiece==0.1.99 tensorboard==2.21.0)
cudnn_frontend_pin=nvidia-cudnn-frontend==1.32.0
key=$(printf '%s\n' "${hf_pins[@]}" "$cudnn_frontend_pin" "$(/usr/bin/python3 -V)" |
  sha256sum | cut -c1-12)
cache=${PENTAD_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pentad}
venv=$cache/venv-$key
mkdir -p "$cache"
# Two steps, each marked done by a file: the environment with the frontend's headers (what
# --build needs), then the pins (--rest).
(
  flock 9
  if [[ ! -f $venv/pentad-frontend && ! -f $venv/pentad-ready ]]; then
    echo "setup: installing $cudnn_frontend_pin into $venv"
    rm -rf "$venv"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    "$venv/bin/python" -m pip install --quiet --no-deps "$cudnn_frontend_pin"
    touch "$venv/pentad-frontend"
  fi
  if [[ $part != build && ! -f $venv/pentad-ready ]]; then
    echo "setup: installing ${hf_pins[*]} into $venv"
    "$venv/bin/python" -m pip install --quiet "${hf_pins[@]}"
    "$venv/bin/python" -c "import torch, transformers, safetensors.torch, sentencepiece; transformers.GPT2Config()"
    "$venv/bin/python" -c "from tensorboard.backend.event_processing import event_accumulator"
    touch "$venv/pentad-ready"
  fi
) 9>"$venv.lock"
if [[ "$(readlink "$root/.venv" 2>/dev/null)" != "$venv" ]]; then
  rm -rf "$root/.venv"  # an older setup's environment of its own, or a link to another
  ln -s "$venv" "$root/.venv"
fi
