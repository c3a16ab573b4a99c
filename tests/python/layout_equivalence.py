#!/usr/bin/env python3
"""Every parallel layout trains exactly like one rank.

For one recipe, trains 20 steps on one rank and under each layout (mpirun), then checks
that every step's loss and every final weight (reassembled from the tp shards through
their global identity) agree with the one-rank run within 1e-5 relative. The one-rank
run for a layout with data-parallel degree d reads the same global batch: the same
micro-batch size with d times the gradient accumulation.

usage: layout_equivalence.py PENTAD RECIPE WORKDIR [section.key=value ...]
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


def main():
    pentad, recipe, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    common = sys.argv[4:]
    work.mkdir(parents=True, exist_ok=True)
    lr = None
    baselines = {}
    failures = []
    for name, ranks, overrides in LAYOUTS:
        tp = int([o for o in overrides if o.startswith("parallel.tp=")][0].split("=")[1])
        dp = ranks // tp
        if dp not in baselines:
            baselines[dp] = run(pentad, recipe, work, f"one-rank-accum{ACCUM * dp}", 1,
                                common + [f"train.grad_accum={ACCUM * dp}"])
        ref_losses, ref_weights = baselines[dp]
        losses, weights = run(pentad, recipe, work, name, ranks,
                              common + overrides + [f"train.grad_accum={ACCUM}"])
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
        print(f"{name:>11} on {ranks} ranks: worst loss rel {loss_err:.2e}, "
              f"worst weight rel {worst:.2e} ({worst_name}) {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(name)
    if failures:
        print("FAILED:", ", ".join(failures))
        sys.exit(1)
    print("every layout matches one rank")


if __name__ == "__main__":
    main()
