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
4. ZeRO-2 shares cut inside experts' rows: dp2 with every expert on both ranks (edp 2) and
   buckets of 20 KiB (three 8 KiB expert matrices each), so the cut of a bucket falls inside
   an expert: the checkpoint holds such an expert's rows in two files, and resumes bitwise
   on the same layout and on other cuts (zero 1 with the default 4 MiB buckets, no ZeRO).
   Bitwise across layouts because two ranks sum every gradient as a + b, exact in either
   order, with one micro-batch per step and no clipping (its norm sums the shares in
   their own order): the rest of the step is elementwise.
5. ZeRO-3, the parameters sharded too (dp4 x ep2: the dense ones over dp 4, the experts' over
   edp 2): bitwise resume; every rank saved the values and moments of its own shares, the
   experts' rows each once; the checkpoint continues on one rank, on ep2 without ZeRO, at
   zero 3 with edp 1 (dp2 x ep2) and at zero 3 on ep2 x etp2, like one rank does; and the
   ZeRO-2 checkpoint of 3 continues at zero 3 with the experts sliced over etp 2.

usage: moe_checkpoint.py PENTAD MOE_RECIPE WORKDIR [section.key=value ...]
"""
import json
import shutil
import sys
from pathlib import Path

import numpy as np

import checkpoint_resume as cr

SP = "parallel.sequence_parallel=true"


def shares_cut_inside_experts(pentad, recipe, work):
    exact = ["train.grad_accum=1", "optim.grad_clip=0"]
    name = "dp2-zero2-cut"
    ckpt = cr.bitwise_resume(pentad, recipe, work, name, 2,
                             exact + ["parallel.zero=2", "parallel.bucket_mb=0.02"])
    saved = ckpt / "step-00000010"
    shards = json.loads((saved / "manifest.json").read_text())["shards"]
    files = {}  # an expert's moment -> the files holding a part of its rows
    for s in shards:
        if s["name"].startswith("adam_m/") and ".experts." in s["name"] and \
                s["local_shape"][0] < s["global_shape"][0]:
            files.setdefault(s["name"], set()).add(s["file"])
    cr.check(any(len(f) == 2 for f in files.values()),
             f"{name}: an edp share ends inside an expert's rows ({len(files)} expert matrices' "
             f"moments split between the two ranks' files)")
    straight = work / f"{name}-straight"
    for other, layout in [("dp2-zero1", ["parallel.zero=1"]), ("dp2", ["parallel.zero=0"])]:
        out = work / f"{name}-on-{other}"
        log = cr.train(pentad, recipe, 2, out,
                       exact + layout + [f"train.ckpt_dir={work / 'unused'}"],
                       ["--resume", str(saved)])
        a, b = cr.losses(straight), cr.losses(out)
        wa, wb = cr.weights(straight), cr.weights(out)
        cr.check("at step 10" in log and sorted(b) == list(range(11, 21)) and
                 all(a[k] == b[k] for k in b) and wa.keys() == wb.keys() and
                 all(np.array_equal(wa[k].view(np.uint32), wb[k].view(np.uint32)) for k in wa),
                 f"{name} resumed on {other}: losses of steps 11-20 and final weights bitwise")


def zero3(pentad, recipe, work):
    ckpt = cr.bitwise_resume(pentad, recipe, work, "dp4xep2-zero3", 4,
                             ["parallel.ep=2", "parallel.zero=3", "train.grad_accum=1"])
    manifest = json.loads((ckpt / "step-00000010" / "manifest.json").read_text())
    for kind in ("param/", "adam_m/"):
        experts = [s for s in manifest["shards"]
                   if s["name"].startswith(kind) and ".experts." in s["name"]]
        dense = [s for s in manifest["shards"]
                 if s["name"].startswith(kind) and ".experts." not in s["name"]]
        rows = {}
        for share in experts:
            rows[share["name"]] = rows.get(share["name"], 0) + share["local_shape"][0]
        cr.check(len({s["file"] for s in experts}) == 4 and
                 len({s["file"] for s in dense}) == 4 and
                 all(rows[s["name"]] == s["global_shape"][0] for s in experts),
                 f"zero-3 dp4 x ep2: every rank saved the {kind[:-1]} of its shares, the dense "
                 f"parameters' and the experts' (each expert's rows once)")
    cr.reshard(pentad, recipe, work, ckpt, "dp4xep2-zero3", {
        "one rank": (1, ["train.grad_accum=4"]),
        "ep2": (2, ["parallel.ep=2", "train.grad_accum=2"]),
        "dp2xep2-zero3": (2, ["parallel.ep=2", "parallel.zero=3", "train.grad_accum=2"]),
        "ep2xetp2-zero3": (4, ["parallel.ep=2", "parallel.etp=2", "parallel.zero=3",
                               "train.grad_accum=1"]),
    })


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
        "dp4xetp2-zero3": (4, ["parallel.etp=2", "parallel.zero=3", "train.grad_accum=1"]),
    })
    shares_cut_inside_experts(pentad, recipe, work)
    zero3(pentad, recipe, work)
    cr.finish("MoE checkpoints resume exactly")


if __name__ == "__main__":
    main()
