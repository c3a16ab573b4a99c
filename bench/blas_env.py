"""The CPU peers run OpenBLAS's kernels as pentad does.

pentad replaces OpenBLAS's generic kernels where OpenBLAS does not know the CPU's model
(kernels/cpu/blas_core.h). Debian's PyTorch takes its BLAS from the same OpenBLAS, which would
give it the generic ones (Prescott: 30 GFLOP/s a core against 130-185 on the machines where
that happens): a comparison of kernels, not of trainers. A benchmark calls
same_blas_kernels() before it imports torch; where pentad replaced OpenBLAS's choice, the
script starts again with OPENBLAS_CORETYPE naming pentad's, which every program it runs
(pentad, pentad_sgemm_bench) inherits.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

PENTAD = Path(__file__).resolve().parent.parent / "build" / "pentad"


def same_blas_kernels(pentad=PENTAD):
    if os.environ.get("OPENBLAS_CORETYPE") or not Path(pentad).exists():
        return
    proc = subprocess.run([str(pentad), "--version"], capture_output=True, text=True,
                          env=dict(os.environ, OPENBLAS_VERBOSE="2"))
    found = re.findall(r"Core: (\w+)", proc.stdout + proc.stderr)
    if len(found) == 2:  # OpenBLAS's choice, then pentad's
        print(f"blas_env: OPENBLAS_CORETYPE={found[-1]} for every side (OpenBLAS picks "
              f"{found[0]} here)", file=sys.stderr)
        os.environ["OPENBLAS_CORETYPE"] = found[-1]
        os.execv(sys.executable, [sys.executable] + sys.argv)
