#!/usr/bin/env python3
"""Every parallel layout trains exactly like one rank.

For one recipe, trains 20 steps on one rank and under each layout (mpirun), then checks
that every step's loss and every final weight (reassembled from the tp shards through
their global identity) agree with the one-rank run within 1e-5 relative. The one-rank
run for a layout with data-parallel degree d reads the same global batch: the same
micro-batch size with d times the gradient accumulation.

With --pipeline, the layouts are pipeline-parallel ones (every schedule, interleaved
stages, and pipeline x data x tensor parallel) on an 8-layer model with 4 micro-batches.

usage: layout_equivalence.py [--pipeline] PENTAD RECIPE WORKDIR [section.key=value ...]
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from shards import load_weights

TOL = 1e-5
STEPS = 20
ACCUM = 2
# (name, ranks, overrides); dp is what is left of the ranks after tp.
LAYOUTS = [
    ("dp2", 2, ["parallel.tp=1"]),
    ("dp4", 4, ["parallel.tp=1"]),
    ("tp2", 2, ["parallel.tp=2"]),
    ("tp4", 4, ["parallel.tp=4"]),
    ("tp2+sp", 2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    ("dp2xtp2", 4, ["parallel.tp=2"]),
    ("dp2xtp2+sp", 4, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
]
PIPELINE_ACCUM = 4
PIPELINE_COMMON = ["model.n_layer=8"]
PIPELINE_LAYOUTS = [
    ("pp2-gpipe", 2, ["parallel.pp=2", "parallel.pp_schedule=gpipe"]),
    ("pp2-1f1b", 2, ["parallel.pp=2", "parallel.pp_schedule=1f1b"]),
    ("pp2-2f2b", 2, ["parallel.pp=2", "parallel.pp_schedule=kfkb", "parallel.pp_group=2"]),
    ("pp2-adaptive", 2, ["parallel.pp=2", "parallel.pp_schedule=adaptive",
                         "parallel.pp_adapt_every=3"]),
    ("pp4-gpipe", 4, ["parallel.pp=4", "parallel.pp_schedule=gpipe"]),
    ("pp4-1f1b", 4, ["parallel.pp=4", "parallel.pp_schedule=1f1b"]),
    ("pp4-3f3b", 4, ["parallel.pp=4", "parallel.pp_schedule=kfkb", "parallel.pp_group=3"]),
    ("pp2-uneven", 2, ["parallel.pp=2", "parallel.pp_layout=3,5"]),
    ("pp2-interleaved-v2", 2, ["parallel.pp=2", "parallel.pp_schedule=interleaved",
                               "parallel.virtual_stages=2"]),
    ("pp4-interleaved-v2", 4, ["parallel.pp=4", "parallel.pp_schedule=interleaved",
                               "parallel.virtual_stages=2"]),
    ("pp2xdp2xtp2-1f1b", 8, ["parallel.pp=2", "parallel.tp=2", "parallel.pp_schedule=1f1b"]),
    ("pp2xdp2xtp2-2f2b+sp", 8, ["parallel.pp=2", "parallel.tp=2", "parallel.pp_schedule=kfkb",
                                "parallel.pp_group=2", "parallel.sequence_parallel=true"]),
]
# Gradients that are zero in exact arithmetic (softmax ignores a constant added to every
# score of a row, so the key bias never matters): Adam turns their rounding noise into
# layout-dependent drift of up to lr per step. They cannot change any loss; the test
# only checks they stay within that bound.
NOISE_ONLY = (".attn.k.bias",)


def run(pentad, recipe, work, name, ranks, overrides):
    out = work / name
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), pentad, "train", recipe,
           "--dump-weights", str(out / "weights")]
    for o in overrides + [f"train.out_dir={out}", f"train.steps={STEPS}", "train.eval_every=0",
                          "train.threads=1", "data.source=random"]:
        cmd += ["--set", o]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        raise SystemExit(f"{name}: pentad failed ({proc.returncode})")
    losses = [json.loads(l)["loss"] for l in (out / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in l]
    return np.array(losses, dtype=np.float64), load_weights(out / "weights")


def degree(overrides, key):
    found = [o for o in overrides if o.startswith(f"parallel.{key}=")]
    return int(found[0].split("=")[1]) if found else 1


def main():
    args = sys.argv[1:]
    pipeline = args[0] == "--pipeline"
    if pipeline:
        args = args[1:]
    pentad, recipe, work = args[0], args[1], Path(args[2])
    common = args[3:] + (PIPELINE_COMMON if pipeline else [])
    accum = PIPELINE_ACCUM if pipeline else ACCUM
    work.mkdir(parents=True, exist_ok=True)
    lr = None
    baselines = {}
    failures = []
    for name, ranks, overrides in PIPELINE_LAYOUTS if pipeline else LAYOUTS:
        dp = ranks // (degree(overrides, "tp") * degree(overrides, "pp"))
        if dp not in baselines:
            baselines[dp] = run(pentad, recipe, work, f"one-rank-accum{accum * dp}", 1,
                                common + [f"train.grad_accum={accum * dp}"])
        ref_losses, ref_weights = baselines[dp]
        losses, weights = run(pentad, recipe, work, name, ranks,
                              common + overrides + [f"train.grad_accum={accum}"])
        if lr is None:
            cfg = (work / name / "recipe.toml").read_text()
            lr = float([l for l in cfg.splitlines() if l.startswith("lr ")][0].split("=")[1])
        loss_err = np.max(np.abs(losses - ref_losses) / np.abs(ref_losses))
        worst, worst_name = 0.0, ""
        for pname, ref in ref_weights.items():
            w = weights[pname]
            if pname.endswith(NOISE_ONLY):
                if np.abs(w).max() > 1.01 * lr * STEPS:
                    failures.append(f"{name}: {pname} moved more than lr per step")
                continue
            err = np.linalg.norm((w - ref).astype(np.float64)) / np.linalg.norm(ref.astype(np.float64))
            if err > worst:
                worst, worst_name = err, pname
        ok = loss_err <= TOL and worst <= TOL and len(losses) == STEPS
        print(f"{name:>20} on {ranks} ranks: worst loss rel {loss_err:.2e}, "
              f"worst weight rel {worst:.2e} ({worst_name}) {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(name)
    if failures:
        print("FAILED:", ", ".join(failures))
        sys.exit(1)
    print("every layout matches one rank")


if __name__ == "__main__":
    main()
