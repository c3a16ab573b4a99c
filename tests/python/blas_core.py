#!/usr/bin/env python3
"""pentad runs OpenBLAS's kernels for what the CPU can do (kernels/cpu/blas_core.h).

OpenBLAS picks its kernels by the CPU's model number, and gives a model it does not know its
generic Prescott ones (Debian 12's 0.3.21 on family 6 model 207, 4-5x slower at SGEMM). Here:
1. `pentad --version` with OpenBLAS's choice printed (OPENBLAS_VERBOSE=2): the kernels it
   ends with are AVX-512 ones where /proc/cpuinfo has AVX-512 F, CD, BW, DQ and VL, at least
   Haswell's where it has AVX2 and FMA;
2. a kernel set the user names (OPENBLAS_CORETYPE) is kept, with no second start;
3. a training run whose kernels were replaced says so in its log.

usage: blas_core.py PENTAD RECIPE WORKDIR
"""
import os
import re
import subprocess
import sys

AVX512 = {"SkylakeX", "Cooperlake", "SapphireRapids"}
AT_LEAST_HASWELL = AVX512 | {"Haswell", "Zen"}


def cores(cmd, **env):
    """The cores OpenBLAS names as `cmd` loads it (OpenBLAS's choice, then pentad's where it
    replaced it), in an environment without a choice of its own but `env`; and the output."""
    base = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE",
                                                             "PENTAD_BLAS_REPICKED")}
    proc = subprocess.run(cmd, env=dict(base, OPENBLAS_VERBOSE="2", **env), capture_output=True,
                          text=True, timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    out = proc.stdout + proc.stderr
    return re.findall(r"Core: (\w+)", out), out


def main():
    pentad, recipe, work = sys.argv[1:4]
    flags = set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    failures = []
    found, _ = cores([pentad, "--version"])
    if {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        wanted, what = AVX512, "AVX-512"
    elif {"avx2", "fma"} <= flags:
        wanted, what = AT_LEAST_HASWELL, "AVX2"
    else:
        wanted, what = None, "neither AVX2 nor AVX-512"
    print(f"CPU with {what}: OpenBLAS's choices {found}")
    if not found:
        failures.append("OpenBLAS printed no core (OPENBLAS_VERBOSE=2)")
    elif wanted and found[-1] not in wanted:
        failures.append(f"ends with {found[-1]}'s kernels on a CPU with {what}")
    if len(found) > 2:
        failures.append(f"started {len(found)} times")
    kept, _ = cores([pentad, "--version"], OPENBLAS_CORETYPE="Haswell")
    if kept != ["Haswell"]:
        failures.append(f"OPENBLAS_CORETYPE=Haswell gave {kept}, not one start with Haswell")
    trained, log = cores([pentad, "train", recipe, "train.steps=1", "train.eval_every=0",
                          f"train.out_dir={work}", "data.source=random"])
    note = re.search(r"OpenBLAS: (\w+) kernels \(it picked its generic (\w+) ones", log)
    if len(trained) == 2 and not (note and note.groups() == (trained[1], trained[0])):
        failures.append(f"kernels {trained[0]} -> {trained[1]} but the log does not say so")
    if len(trained) == 1 and note:
        failures.append("the log names a replacement that did not happen")
    if failures:
        print("FAILED:", "; ".join(failures))
        sys.exit(1)
    print("OpenBLAS runs the kernels this CPU allows")


if __name__ == "__main__":
    main()
