#!/usr/bin/env python3
"""Context-parallel checkpoints do not depend on cp.

1. Bitwise resume of a cp2 run (ring): 20 straight steps against 10 + save + --resume for
   10: losses and final weights bitwise.
2. Reshard: the step-10 checkpoint of a cp4 run (ring) resumed on one rank, on cp2 x dp2
   and on cp4 Ulysses (same global batch) continues like one rank resumed from it, within
   1e-5; so does the cp2 checkpoint.

usage: cp_checkpoint.py PENTAD RECIPE WORKDIR [section.key=value ...]
"""
import shutil
import sys
from pathlib import Path

import checkpoint_resume as cr


def main():
    pentad, recipe, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    cr.COMMON.extend(sys.argv[4:])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    targets = {
        "one rank": (1, ["train.grad_accum=2"]),
        "cp2xdp2": (4, ["parallel.cp=2", "parallel.cp_impl=ring", "train.grad_accum=1"]),
        "cp4-ulysses": (4, ["parallel.cp=4", "parallel.cp_impl=ulysses", "parallel.dp=1",
                            "train.grad_accum=2"]),
    }
    ckpt = cr.bitwise_resume(pentad, recipe, work, "cp2", 2,
                             ["parallel.cp=2", "parallel.cp_impl=ring", "train.grad_accum=2"])
    cr.reshard(pentad, recipe, work, ckpt, "cp2", targets)
    ckpt = cr.bitwise_resume(pentad, recipe, work, "cp4", 4,
                             ["parallel.cp=4", "parallel.cp_impl=ring", "train.grad_accum=2"])
    cr.reshard(pentad, recipe, work, ckpt, "cp4", targets)
    cr.finish("context-parallel checkpoints resume exactly")


if __name__ == "__main__":
    main()
