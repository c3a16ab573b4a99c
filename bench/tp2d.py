#!/usr/bin/env python3
"""2D against 1D tensor parallelism on 8 CPU ranks, with even links and with uneven ones.

Uneven: two simulated nodes of 4 ranks (PENTAD_SIM_NODES, parallel/comm.h), links between
them slowed to GBS GB/s with LAT_US extra latency. Every layout is tp 8 of one GPT-2-shaped
model; each runs STEPS steps (median step time of the last ones, from metrics.jsonl) in
ROUNDS rounds, layouts interleaved within a round so that machine noise spreads over all.
Bytes per rank and step come from the communication log (--comm-log): the buffers each
collective passed, summed by communicator (tp, or 2D's tp_heads / tp_hidden / tp_all; with
row order and shape 2x4 on two nodes of 4, tp_heads is the one that crosses them).

usage: python3 bench/tp2d.py PENTAD [--rounds 2] [--steps 6] [--sim 4:200:0.5] [--out DIR]
Prints a markdown table (bench/RESULTS.md, "2D tensor parallelism on CPU ranks").
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "gpt-tiny.toml"
MODEL = ["model.d_model=128", "model.n_head=8", "model.n_layer=2", "model.vocab_size=2048",
         "model.max_seq_len=128", "train.seq_len=128", "train.micro_batch=4",
         "train.eval_every=0", "data.source=random", "train.threads=1"]
LAYOUTS = [
    ("1D tp 8", []),
    ("2D 2x4 row", ["parallel.tp_shape=2x4", "parallel.tp_order=row"]),
    ("2D 2x4 column", ["parallel.tp_shape=2x4", "parallel.tp_order=column"]),
    ("2D 4x2 row", ["parallel.tp_shape=4x2", "parallel.tp_order=row"]),
    ("2D 2x4 row, 2 chunks", ["parallel.tp_shape=2x4", "parallel.tp_order=row",
                              "parallel.tp_chunks=2"]),
]


def run(pentad, out, overrides, steps, sim):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    if sim:
        env["PENTAD_SIM_NODES"] = sim
    cmd = ["mpirun", "--oversubscribe", "-np", "8", "-q", pentad, "train", str(RECIPE),
           *MODEL, "parallel.tp=8", f"train.steps={steps}", f"train.out_dir={out}", *overrides,
           "--comm-log", str(out / "comm")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    seconds = [r["seconds"] for r in rows if "seconds" in r and r.get("step", 0) > 2]
    return statistics.median(seconds)


def bytes_by_comm(out, steps):
    """Per rank and step: {communicator: bytes of the buffers its operations passed}."""
    total = {}
    for f in sorted((out / "comm").glob("rank*.json")):
        for e in json.loads(f.read_text())["events"]:
            total[e["comm"]] = total.get(e["comm"], 0) + e["bytes"]
    ranks = len(list((out / "comm").glob("rank*.json")))
    return {c: b / ranks / steps for c, b in total.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pentad")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--sim", default="4:200:0.5")
    ap.add_argument("--out", default="/tmp/pentad-tp2d")
    a = ap.parse_args()
    base = Path(a.out)
    times = {}
    traffic = {}
    for links, sim in (("even", ""), ("uneven", a.sim)):
        for r in range(a.rounds):
            for name, overrides in LAYOUTS:
                out = base / f"{links}-{r}-{name.replace(' ', '_').replace(',', '')}"
                s = run(a.pentad, out, overrides, a.steps, sim)
                times.setdefault((links, name), []).append(s)
                if r == 0:
                    traffic[(links, name)] = bytes_by_comm(out, a.steps)
                print(f"{links:6} round {r} {name:22} {s * 1e3:8.1f} ms/step", file=sys.stderr)
    print(f"| layout | even links: ms/step | uneven ({a.sim}): ms/step | uneven / even | "
          "collective bytes a rank passes a step, by group |")
    print("|---|---:|---:|---:|---|")
    for name, _ in LAYOUTS:
        even = statistics.median(times[("even", name)])
        uneven = statistics.median(times[("uneven", name)])
        groups = ", ".join(f"{c} {b / 2**20:.1f} MiB"
                           for c, b in sorted(traffic[("even", name)].items()) if b > 0)
        print(f"| {name} | {even * 1e3:.1f} | {uneven * 1e3:.1f} | {uneven / even:.2f} | "
              f"{groups} |")


if __name__ == "__main__":
    main()
