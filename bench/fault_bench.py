#!/usr/bin/env python3
"""Fault detection and recovery over repeated trials, and the monitor's cost in a clean run.

For each fault (the same injections as tests/python/fault_detection.py), N trials of
`pentad launch -- mpirun -np 4 pentad train` on gpt-tiny (dp 4, a save every 5 steps, the
fault at step 12): detection latency (median, max), culprit accuracy, time from detection to
training again, steps lost, trials that finished. The slow link runs with
parallel.ring_all_reduce (its link matrix); nan expects no detection (the job drops the step);
exclude is a kill under --exclude-culprit (dp 4 -> 3). Then the monitor's overhead: the same
clean run with and without `pentad launch`, and the ring all-reduce's: MPI's against
pentad's ring, each alternated, median step time.

usage: python3 bench/fault_bench.py [--trials 10] [--pentad build/pentad] [--work DIR]
                                    [--faults kill,slowlink,...] [--no-overhead]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1")
ENV.pop("PENTAD_POISON", None)
RING = ["parallel.ring_all_reduce=true"]
# name, injection, class (None: no detection wanted), culprit, overrides, launch options
FAULTS = [("kill", "kill:2:12", "dead", 2, [], []),
          ("sigstop", "stop:1:12", "non-comm hang", 1, [], []),
          ("hang", "hang:3:12", "non-comm hang", 3, [], []),
          ("commhang", "commhang:1:12", "comm hang", 1, [], []),
          ("slow", "slow:2:5:6", "non-comm slow", 2, [], []),
          ("slowlink", "slowlink:1:2:5", "comm slow", [1, 2], RING, []),
          ("nan", "nan:1:12", None, None, [], []),
          ("corrupt", "corrupt:1:12", "dead", 1, [], []),
          ("exclude", "kill:2:12", "dead", 2, [], ["--exclude-culprit"])]


def train_cmd(pentad, out, steps, extra=()):
    cmd = ["mpirun", "--oversubscribe", "-np", "4", pentad, "train", "recipes/gpt-tiny.toml"]
    for o in ["train.eval_every=0", "train.threads=1", "data.source=random",
              "train.micro_batch=2", "train.seq_len=32", "train.log_every=100",
              "train.save_every=5", "parallel.tp=1", f"train.steps={steps}",
              f"train.out_dir={out}", *extra]:
        cmd += ["--set", o]
    return cmd


def events(out):
    path = out / "events.jsonl"
    return [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []


def step_seconds(out):
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(l["seconds"] for l in lines if "seconds" in l)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--pentad", default="build/pentad")
    ap.add_argument("--work", default="/tmp/pentad-fault-bench")
    ap.add_argument("--faults", default="", help="comma-separated names (default: all)")
    ap.add_argument("--no-overhead", action="store_true", help="skip the clean-run timings")
    a = ap.parse_args()
    wanted = set(a.faults.split(",")) if a.faults else {f[0] for f in FAULTS}
    pentad, work = str(Path(a.pentad).resolve()), Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    print(f"| fault | trials | culprit right | detection latency median / max (s) | "
          f"detection to training again median (s) | steps lost median | finished |")
    print("|---|---|---|---|---|---|---|")
    for name, spec, klass, culprit, extra, options in FAULTS:
        if name not in wanted:
            continue
        latency, again, lost, right, done = [], [], [], 0, 0
        for trial in range(a.trials):
            out = work / f"{name}-{trial}"
            proc = subprocess.run([pentad, "launch", *options, "--", *train_cmd(
                pentad, out, 30, [f"train.inject_fault={spec}", *extra])], env=ENV,
                capture_output=True, text=True, timeout=300)
            ev = events(out)
            det = [e for e in ev if e.get("event") == "detection"]
            right += klass is None and not det  # nan: right when nothing is detected
            if det:
                latency.append(det[0]["latency_s"])
                right += det[0]["class"] == klass and det[0]["culprit"] == culprit
            resumed = [e for e in ev if e.get("event") == "resumed"]
            if resumed:
                again.append(resumed[0]["seconds_to_resume"])
                lost.append(resumed[0]["steps_lost"])
            done += proc.returncode == 0
        med = lambda xs: f"{statistics.median(xs):.2f}" if xs else "-"
        worst = f"{max(latency):.2f}" if latency else "-"
        print(f"| {name} | {a.trials} | {right}/{a.trials} | {med(latency)} / {worst} | {med(again)} | "
              f"{med(lost)} | {done}/{a.trials} |", flush=True)

    if a.no_overhead:
        return
    plain, watched = [], []
    for trial in range(3):  # alternated, A B A B
        out = work / f"plain-{trial}"
        subprocess.run(train_cmd(pentad, out, 300, ["train.save_every=0"]), env=ENV,
                       check=True, capture_output=True)
        plain.append(step_seconds(out))
        out = work / f"watched-{trial}"
        subprocess.run([pentad, "launch", "--", *train_cmd(pentad, out, 300,
                                                            ["train.save_every=0"])],
                       env=ENV, check=True, capture_output=True)
        watched.append(step_seconds(out))
    p, w = statistics.median(plain), statistics.median(watched)
    print(f"\nclean run, 300 steps, median step: plain {p * 1e3:.2f} ms, under pentad launch "
          f"{w * 1e3:.2f} ms: overhead {100 * (w / p - 1):+.1f}% (runs: plain "
          f"{[round(x * 1e3, 2) for x in plain]}, launched {[round(x * 1e3, 2) for x in watched]})")
    mpi, ring = [], []
    for trial in range(3):  # alternated: MPI's all-reduce, pentad's ring
        for kind, into in (("mpi", mpi), ("ring", ring)):
            out = work / f"{kind}-{trial}"
            ring_key = "parallel.ring_all_reduce=" + ("true" if kind == "ring" else "false")
            subprocess.run(train_cmd(pentad, out, 300, ["train.save_every=0", ring_key]),
                           env=ENV, check=True, capture_output=True)
            into.append(step_seconds(out))
    m, r = statistics.median(mpi), statistics.median(ring)
    print(f"clean run, 300 steps, median step: MPI all-reduce {m * 1e3:.2f} ms, pentad's ring "
          f"{r * 1e3:.2f} ms: ring/MPI {r / m:.2f} (runs: MPI {[round(x * 1e3, 2) for x in mpi]}, "
          f"ring {[round(x * 1e3, 2) for x in ring]})")


if __name__ == "__main__":
    main()
