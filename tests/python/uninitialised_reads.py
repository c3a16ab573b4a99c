#!/usr/bin/env python3
"""Regression loop for a read of uninitialised memory in the backward (issue 12).

The last chunk's backward used to clear the residual-stream gradient by scaling it by 0,
so NaN bytes left in that scratch by earlier heap users (here: the in-process, 2-thread
tokenisation of the bundled corpus, which runs when there is no data/ cache) survived
into the gradients: "grad norm -nan" at step 1 in about 4 runs of 10. This runs that
exact case in empty directories, LOOPS times on the natural heap and once with
PENTAD_POISON=1 (every arena starts as NaN, so any such read fails every time), and
requires every run to finish with finite losses and gradient norms.

usage: uninitialised_reads.py PENTAD RECIPE_DIR WORKDIR
"""
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

LOOPS = 6


def main():
    pentad, recipes, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    failures = []
    for i in range(LOOPS + 1):
        poison = i == LOOPS
        run_dir = work / f"run{i}"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)  # empty: no data/ cache, so the corpus is tokenised here
        env = {k: v for k, v in os.environ.items() if k != "PENTAD_POISON"}
        if poison:
            env["PENTAD_POISON"] = "1"
        cmd = [pentad, "train", str(recipes / "llama-tiny.toml"), "model.n_layer=4",
               "train.micro_batch=2", "train.grad_accum=4", "train.steps=3",
               "train.eval_every=0", "train.threads=2"]
        proc = subprocess.run(cmd, cwd=run_dir, env=env, capture_output=True, text=True)
        label = f"run {i}{' (PENTAD_POISON=1)' if poison else ''}"
        if proc.returncode != 0:
            failures.append(f"{label}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
            continue
        metrics = [json.loads(l) for l in
                   (run_dir / "runs" / "llama-tiny" / "metrics.jsonl").read_text().splitlines()]
        steps = [m for m in metrics if "grad_norm" in m]
        bad = [m for m in steps if not (math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]))]
        if len(steps) != 3 or bad:
            failures.append(f"{label}: {len(steps)} steps, non-finite: {bad}")
        else:
            print(f"{label}: losses {[round(m['loss'], 4) for m in steps]}, "
                  f"grad norms {[round(m['grad_norm'], 3) for m in steps]}")
    if failures:
        print("\n".join(failures))
        sys.exit(1)
    print("no uninitialised reads")


if __name__ == "__main__":
    main()
