#!/usr/bin/env python3
"""MoE checkpoints: every expert saved once under its global name, whatever the layout.

1. Bitwise resume of an ep2 run (dp2 x ep2) and of an ep4 run folded over dp2 x tp2 + SP:
   20 straight steps against 10 + save + --resume for 10: losses and final weights (the
   experts, their optimizer state and the aux-loss-free selection bias included) bitwise.
2. Reshard: each of those step-10 checkpoints resumed on one rank, on ep2, on ep4 and on
   ep2 x etp2 (same global batch) continues like one rank resumed from it, within 1e-5.
3. ZeRO-2 with the experts' state sharded over edp 2 (dp4 x ep2): bitwise resume; every
   rank saved the moments of its own shares of the experts (each expert's rows once); the
   checkpoint continues on one rank, on ep2 without ZeRO, at zero 1 with ep2 folded over
   dp2 x tp2 + SP, and at zero 1 on ep2 x etp2 (edp 1) like one rank does.

usage: moe_checkpoint.py PENTAD MOE_RECIPE WORKDIR [section.key=value ...]
"""
import json
import shutil
import sys
from pathlib import Path

import checkpoint_resume as cr

SP = "parallel.sequence_parallel=true"


def main():
    pentad, recipe, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    cr.COMMON.extend(sys.argv[4:])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    targets = {
        "one rank": (1, ["train.grad_accum=4"]),
        "ep2": (2, ["parallel.ep=2", "train.grad_accum=2"]),
        "ep4": (4, ["parallel.ep=4", "train.grad_accum=1"]),
        "ep2xetp2": (4, ["parallel.ep=2", "parallel.etp=2", "train.grad_accum=1"]),
    }
    ckpt = cr.bitwise_resume(pentad, recipe, work, "dp2xep2", 2,
                             ["parallel.ep=2", "train.grad_accum=2"])
    cr.reshard(pentad, recipe, work, ckpt, "dp2xep2", targets)
    ckpt = cr.bitwise_resume(pentad, recipe, work, "ep4-on-dp2xtp2", 4,
                             ["parallel.tp=2", SP, "parallel.ep=4", "train.grad_accum=2"])
    cr.reshard(pentad, recipe, work, ckpt, "ep4-on-dp2xtp2", targets)
    ckpt = cr.bitwise_resume(pentad, recipe, work, "dp4xep2-zero2", 4,
                             ["parallel.ep=2", "parallel.zero=2", "train.grad_accum=1"])
    manifest = json.loads((ckpt / "step-00000010" / "manifest.json").read_text())
    shares = [s for s in manifest["shards"]
              if s["name"].startswith("adam_m/") and ".experts." in s["name"]]
    rows = {}
    for share in shares:
        rows[share["name"]] = rows.get(share["name"], 0) + share["local_shape"][0]
    cr.check(len({s["file"] for s in shares}) == 4 and
             all(rows[s["name"]] == s["global_shape"][0] for s in shares),
             "zero-2 dp4 x ep2: every rank saved the moments of its shares of the experts, "
             "together each expert's rows once")
    cr.reshard(pentad, recipe, work, ckpt, "dp4xep2-zero2", {
        "one rank": (1, ["train.grad_accum=4"]),
        "ep2": (2, ["parallel.ep=2", "train.grad_accum=2"]),
        "ep2-on-dp2xtp2-zero1": (4, ["parallel.tp=2", SP, "parallel.ep=2", "parallel.zero=1",
                                     "train.grad_accum=2"]),
        "ep2xetp2-zero1": (4, ["parallel.ep=2", "parallel.etp=2", "parallel.zero=1",
                               "train.grad_accum=1"]),
    })
    cr.finish("MoE checkpoints resume exactly")


if __name__ == "__main__":
    main()
