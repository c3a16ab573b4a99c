#!/usr/bin/env bash
# Prepares, on this (development) machine, everything a GPU machine without pentad's Debian
# packages needs to run the GPU suite and the GPU benchmark: scripts/gpu_run.sh runs it there.
#   bash scripts/gpu_bundle.sh
# Builds pentad with CUDA into build-gpu/ (Release, sm_90 only: H100 and H200; no
# -march=native, since the GPU machine's processor may differ from this one's), then writes
# the ignored folder .gpu/:
#   .gpu/pentad-gpu.tar.xz  the binaries (pentad, the GPU tests, the kernel benchmark), every
#                           shared library they need that is not glibc, libstdc++, libgcc or
#                           part of CUDA (Open MPI, HDF5, OpenBLAS, spdlog, ...), Open MPI's
#                           plugins and help files, and its launcher (orterun, with PMIx) for
#                           the multi-rank tests on one machine (scripts/gpu_run.sh multi);
#   .gpu/MANIFEST.txt       what is inside, where each file came from, the commit and sizes.
# libcublasLt (541 MB), libnccl (218 MB), libcudnn (with its engines, about 1 GB) and
# libnvrtc (100 MB) are not bundled: they do not compress and the device tool carries 64 MiB
# at most. The GPU machine has them all (the CUDA 13 toolkit and python's nvidia-* packages,
# nvidia-cudnn-cu13 among them); scripts/gpu_run.sh finds them there.
# Environment: PENTAD_GPU_BUILD_DIR (default build-gpu), PENTAD_GPU_ARCHS (default 90).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${PENTAD_GPU_BUILD_DIR:-build-gpu}
archs=${PENTAD_GPU_ARCHS:-90}
max_mib=48  # leave room under the tool's 64 MiB for the working tree and other carried paths

bash scripts/setup.sh
command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
  { echo "gpu_bundle: no nvcc here: cannot build the CUDA backend" >&2; exit 1; }
# x86-64-v3 (AVX2, FMA): every H100/H200 host has it; -march=native might not run there.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPENTAD_CUDA=ON \
  -DPENTAD_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3 \
  -DPENTAD_CUDA_ARCHITECTURES="$archs" >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log" >&2; exit 1; }
grep -q "pentad: CUDA backend ON" "$build.configure.log" ||
  { echo "gpu_bundle: CMake did not enable the CUDA backend" >&2; exit 1; }
grep -q "pentad: NCCL backend ON" "$build.configure.log" ||
  { echo "gpu_bundle: CMake found no NCCL: nccl_comm_test would be missing" >&2; exit 1; }
gpu_tests=(cuda_kernels_test cuda_train_test nccl_comm_test device_checkpoint_test
  cuda_zero_test cuda_moe_test cuda_layout_test)  # the last three: multi-rank (gpu_multi)
targets=(pentad pentad_gpu_kernels_bench "${gpu_tests[@]}")
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"

stage=$(mktemp -d /tmp/pentad-gpu-bundle.XXXXXX)
trap 'rm -rf "$stage"' EXIT
root=$stage/pentad-gpu
ompi_sys=/usr/lib/x86_64-linux-gnu/openmpi/lib
# OPAL_PREFIX=$root/ompi relocates Open MPI's compiled-in /usr: its libdir and plugin folder
# (pkglibdir) become these, below the new prefix.
ompi_plugins=$root/ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
mkdir -p "$root/bin" "$root/lib" "$root/build" "$ompi_plugins" "$root/ompi/share/openmpi" \
  "$root/ompi/etc" "$root/hwloc-plugins" "$root/pmix-plugins"

# ---- binaries ----
for t in pentad pentad_gpu_kernels_bench; do cp "$build/$t" "$root/bin/"; done
for t in "${gpu_tests[@]}"; do cp "$build/tests/cuda/$t" "$root/bin/"; done
# Open MPI's launcher, for the multi-rank tests (every rank on this machine: no orted).
cp -L "$(command -v orterun)" "$root/bin/orterun"
strip --strip-unneeded "$root"/bin/*

# ---- shared libraries ----
# Left to the GPU machine: glibc, the compiler's runtime (libstdc++, libgcc_s), and CUDA's
# driver, cuBLASLt, NCCL, cuDNN and NVRTC. libcudart is bundled: it is small and the build's own.
system_re='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libstdc\+\+|libgcc_s|libcuda|libcublasLt|libcublas|libnccl|libcudnn|libnvrtc)\.so'
declare -A origin=()   # soname -> file it was copied from
missing=()
add_deps() {  # add_deps FILE...: copy what each needs (ldd lists the whole closure)
  local f line name path
  for f in "$@"; do
    while read -r line; do
      if [[ $line =~ ^([^[:space:]]+)\ =\>\ not\ found ]]; then
        missing+=("${BASH_REMATCH[1]} (needed by $(basename "$f"))")
        continue
      fi
      [[ $line =~ ^([^[:space:]]+)\ =\>\ (/[^[:space:]]+) ]] || continue
      name=${BASH_REMATCH[1]} path=${BASH_REMATCH[2]}
      [[ $name =~ $system_re ]] && continue
      [[ -n ${origin[$name]:-} ]] && continue
      origin[$name]=$(readlink -f "$path")
      cp -L "$path" "$root/lib/$name"
    done < <(ldd "$f" | sed 's/^[[:space:]]*//')
  done
}
add_deps "$root"/bin/*
# PMIx (its libraries through the plugin that wires mpirun's ranks to it), so that the
# plugin passes the filter below.
add_deps "$ompi_sys"/openmpi3/mca_pmix_ext3x.so
# PMIx's own plugins (compression, resource managers), read from pmix-plugins/ (env.sh).
cp -L /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/pmix_mca_*.so "$root/pmix-plugins/"
add_deps "$root"/pmix-plugins/*.so

# Open MPI's plugins: those whose libraries are all bundled or system ones (the ones for
# InfiniBand, UCX, libfabric, PSM, external PMIx and OpenSHMEM are left out; a one-rank
# singleton uses none of them), and the three libmca_common_* libraries some plugins use.
allowed_extra_re='^libmca_common_(sm|monitoring|ompio)\.so'
for p in "$ompi_sys"/openmpi3/mca_*.so; do
  ok=1
  while read -r name; do
    [[ $name =~ $system_re || -n ${origin[$name]:-} || $name =~ $allowed_extra_re ]] || { ok=0; break; }
  done < <(ldd "$p" | awk '$2 == "=>" {print $1}')
  ((ok)) && cp -L "$p" "$ompi_plugins/"
done
add_deps "$ompi_plugins"/*.so
cp -L /usr/share/openmpi/help-*.txt "$root/ompi/share/openmpi/"
if ((${#missing[@]})); then
  printf 'gpu_bundle: not found here: %s\n' "${missing[@]}" >&2
  exit 1
fi
# Open MPI's settings for the bundle (read through OPAL_SYSCONFDIR, set by env.sh).
cat >"$root/ompi/etc/openmpi-mca-params.conf" <<'EOF'
# pentad GPU bundle: singletons and mpirun's ranks on this machine, shared memory and self only.
btl = self,vader
pml = ob1
btl_base_warn_component_unused = 0
EOF

# ---- environment and launchers ----
cat >"$root/env.sh" <<'EOF'
# The environment the bundled programs need. Set PENTAD_GPU_ENV to this file's path, then
# source it (sh or bash). Sets PENTAD_GPU_ROOT, the bundle's folder.
PENTAD_GPU_ROOT=$(cd "$(dirname "${PENTAD_GPU_ENV:?the path of env.sh}")" && pwd)
export PENTAD_GPU_ROOT
# CUDA's cuBLASLt, NCCL, cuDNN and NVRTC on the GPU machine (scripts/gpu_run.sh finds them
# and sets this).
cuda_libs=${PENTAD_GPU_CUDA_LIBS:-/usr/local/cuda/lib64:/usr/local/cuda/lib}
fallback=
[ "${PENTAD_GPU_LIBSTDCXX:-0}" = 1 ] && fallback=$PENTAD_GPU_ROOT/lib/fallback:
export LD_LIBRARY_PATH="$fallback$PENTAD_GPU_ROOT/lib:$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Open MPI: its compiled-in /usr becomes the bundle's ompi/ (plugins, help files); a
# singleton starts no daemon; hwloc loads no plugins from the system's folders.
export OPAL_PREFIX=$PENTAD_GPU_ROOT/ompi
export OPAL_SYSCONFDIR=$PENTAD_GPU_ROOT/ompi/etc
export OMPI_MCA_ess_singleton_isolated=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# mpirun starts every rank on this machine itself (no ssh, no orted), as many as asked for.
export OMPI_MCA_plm=isolated OMPI_MCA_rmaps_base_oversubscribe=1
export HWLOC_PLUGINS_PATH=$PENTAD_GPU_ROOT/hwloc-plugins
# PMIx: plugins only from the bundle (a machine's own PMIx, another version, fails to load
# into the bundled library), and no warning that compression is missing.
export PMIX_MCA_mca_base_component_path=$PENTAD_GPU_ROOT/pmix-plugins
export PMIX_MCA_pcompress_base_silence_warning=1
unset cuda_libs fallback
EOF
for t in pentad pentad_gpu_kernels_bench orterun "${gpu_tests[@]}"; do
  cat >"$root/build/$t" <<EOF
#!/bin/sh
# Runs the bundled $t with the bundle's libraries (scripts/gpu_bundle.sh).
PENTAD_GPU_ENV=\$(dirname "\$0")/../env.sh
. "\$PENTAD_GPU_ENV"
exec "\$PENTAD_GPU_ROOT/bin/$t" "\$@"
EOF
  chmod +x "$root/build/$t"
done
# libstdc++ and libgcc_s from here, used only where the GPU machine's are older than the
# build needs (scripts/gpu_run.sh checks, then sets PENTAD_GPU_LIBSTDCXX=1).
mkdir -p "$root/lib/fallback"
cp -L /lib/x86_64-linux-gnu/libstdc++.so.6 /lib/x86_64-linux-gnu/libgcc_s.so.1 "$root/lib/fallback/"

# ---- manifest ----
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain 2>/dev/null | grep -c . || true)
{
  echo "pentad GPU bundle, made $(date -u +%FT%TZ) on $(hostname)"
  echo "commit $commit ($dirty files changed in the working tree)"
  echo "build: $build, Release, CUDA architectures $archs, -march=x86-64-v3, $(nvcc --version 2>/dev/null | tail -1 || true)"
  echo "glibc here: $(ldd --version | head -1)"
  echo
  echo "bundled libraries (soname <- file here <- Debian package):"
  for name in $(printf '%s\n' "${!origin[@]}" | sort); do
    pkg=$(dpkg -S "${origin[$name]}" 2>/dev/null | head -1 | cut -d: -f1 || true)
    echo "  $name <- ${origin[$name]} <- ${pkg:-not from a Debian package}"
  done
  echo
  echo "Open MPI plugins: $(ls "$ompi_plugins" | wc -l) ($(ls "$ompi_plugins" | sed 's/^mca_//; s/\.so$//' | tr '\n' ' '))"
  echo
  echo "files (bytes):"
  (cd "$stage" && find pentad-gpu -type f -printf '%s %p\n' | sort -k2)
} >"$stage/MANIFEST.txt"
cp "$stage/MANIFEST.txt" "$root/MANIFEST.txt"
echo "$commit" >"$root/COMMIT"

# ---- pack ----
rm -rf .gpu
mkdir -p .gpu
XZ_OPT="-9 -T0" tar -cJf .gpu/pentad-gpu.tar.xz -C "$stage" --owner=0 --group=0 pentad-gpu
cp "$stage/MANIFEST.txt" .gpu/MANIFEST.txt
raw=$(du -sb "$root" | cut -f1)
packed=$(stat -c %s .gpu/pentad-gpu.tar.xz)
echo "gpu_bundle: .gpu/pentad-gpu.tar.xz: $((packed / 1024 / 1024)) MiB ($packed bytes; unpacked $((raw / 1024 / 1024)) MiB, ${#origin[@]} libraries, $(ls "$ompi_plugins" | wc -l) Open MPI plugins)"
echo "  size:  packed $packed bytes, unpacked $raw bytes" >>.gpu/MANIFEST.txt
if ((packed > max_mib * 1024 * 1024)); then
  echo "gpu_bundle: the bundle is over $max_mib MiB: too large to carry with the working tree" >&2
  exit 1
fi
echo "gpu_bundle: on the GPU machine: run(carry [\".gpu\"], command \"bash scripts/gpu_run.sh \$OUT\")"
