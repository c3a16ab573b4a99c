#!/usr/bin/env python3
"""Pipeline parallelism on this machine's cores: measured bubbles and kFkB on slow links.

1. Bubble: for each (schedule, p, m), pentad trains a few steps with --trace; the trace's
   measured bubble fraction (1 - mean busy / step window, steps after the first) is put
   beside the ideal one: (p-1)/(m+p-1) for 1F1B, (p-1)/(v*m+p-1) interleaved.
2. Slow links: pp2 with every stage-to-stage send delivered `delay` ms late
   (parallel.pp_link_delay_ms), median step time of 1F1B, kFkB (k = 2, 4) and adaptive
   kFkB, each as a ratio to 1F1B at the same delay.

Runs A/B alternated, median over steps after warm-up (../shared/MEASURE.md). Prints
markdown tables for bench/RESULTS.md.

usage: pipeline_bench.py [--quick] [PENTAD]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PENTAD = str(ROOT / "build" / "pentad")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1")
MODEL = ["model.family=gpt2", "model.n_layer=8", "model.d_model=128", "model.n_head=4",
         "model.vocab_size=1024", "model.max_seq_len=128", "train.seq_len=128",
         "train.micro_batch=2", "train.threads=1", "data.source=random", "train.eval_every=0",
         "train.log_every=1000", "optim.warmup_steps=2"]


def run(ranks, overrides, steps, trace=None):
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), PENTAD, "train",
               str(ROOT / "recipes" / "gpt-tiny.toml")]
        for o in MODEL + overrides + [f"train.steps={steps}", f"train.out_dir={tmp}"]:
            cmd += ["--set", o]
        if trace:
            cmd += ["--trace", trace]
        proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-2000:])
            raise SystemExit(f"pentad failed: {' '.join(overrides)}")
        rows = [json.loads(l) for l in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
        seconds = [r["seconds"] for r in rows if "seconds" in r]
        return seconds, proc.stdout + proc.stderr


def bubbles(quick):
    print("| schedule | p | m | v | bubble measured | bubble ideal | step s |")
    print("|---|---|---|---|---|---|---|")
    cases = [("1f1b", 2, m, 1) for m in (2, 4, 8, 16)] + [("gpipe", 2, 8, 1)]
    cases += [("interleaved", 2, m, 2) for m in (2, 4, 8)]
    if not quick:
        cases += [("1f1b", 4, m, 1) for m in (4, 8, 16)] + [("interleaved", 4, 8, 2)]
    for schedule, p, m, v in cases:
        with tempfile.TemporaryDirectory() as tmp:
            trace = f"{tmp}/trace.json"
            seconds, _ = run(p, [f"parallel.pp={p}", f"parallel.pp_schedule={schedule}",
                                 f"parallel.virtual_stages={v}", f"train.grad_accum={m}"],
                             4 if quick else 6, trace)
            other = json.loads(Path(trace).read_text())["otherData"]
        print(f"| {schedule} | {p} | {m} | {v} | {other['measured_bubble_fraction']:.3f} | "
              f"{other['ideal_bubble_fraction']:.3f} | {statistics.median(seconds[1:]):.3f} |")


def slow_links(quick):
    schedules = [("1f1b", ["parallel.pp_schedule=1f1b"]),
                 ("kfkb k=2", ["parallel.pp_schedule=kfkb", "parallel.pp_group=2"]),
                 ("kfkb k=4", ["parallel.pp_schedule=kfkb", "parallel.pp_group=4"]),
                 ("adaptive", ["parallel.pp_schedule=adaptive", "parallel.pp_adapt_every=2"])]
    delays = (0, 20) if quick else (0, 5, 20, 50)
    reps = 1 if quick else 2
    steps = 6 if quick else 10
    print("| link delay ms | " + " | ".join(f"{n} step s (x 1F1B)" for n, _ in schedules) + " | adaptive chose |")
    print("|---|" + "---|" * (len(schedules) + 1))
    for delay in delays:
        times = {n: [] for n, _ in schedules}
        chose = ""
        for _ in range(reps):  # A/B alternated
            for name, keys in schedules:
                seconds, log = run(2, ["parallel.pp=2", "train.grad_accum=8",
                                       f"parallel.pp_link_delay_ms={delay}"] + keys, steps)
                times[name] += seconds[3:]  # after warm-up (and adaptive's first choice)
                if name == "adaptive":
                    chose = ", ".join(l.split(": k = ")[1].split(" ")[0]
                                      for l in log.splitlines() if "adaptive kFkB" in l)
        base = statistics.median(times["1f1b"])
        cells = [f"{statistics.median(times[n]):.3f} ({statistics.median(times[n]) / base:.2f})"
                 for n, _ in schedules]
        print(f"| {delay} | " + " | ".join(cells) + f" | k = {chose} |")


def main():
    global PENTAD
    args = sys.argv[1:]
    quick = "--quick" in args
    args = [a for a in args if a != "--quick"]
    if args:
        PENTAD = args[0]
    bubbles(quick)
    print()
    slow_links(quick)


if __name__ == "__main__":
    main()
