#!/usr/bin/env python3
"""A slow link re-planned around (issue 48, part 2): 4 ranks of gpt-tiny, global batch 16
sequences, the link between ranks 1 and 2 slowed by 20 ms a send from step 2.

1. Every candidate layout of the 4 ranks, measured with the link slowed: the median step of
   steps 10..STEPS (and without the slow link, for scale).
2. `pentad launch --replan` (this machine's calibration) on dp 4 with the link slowed: the
   detection, the re-planned layout, how many steps after the report the restart came, and
   the re-planned layout's median step after its resume, against the best measured in 1.

usage: replan_slow_link.py PENTAD RECIPE WORK_DIR [STEPS]
"""
import json
import os
import shutil
import statistics
import subprocess
import sys

PENTAD, RECIPE, WORK = (os.path.abspath(a) for a in sys.argv[1:4])
STEPS = int(sys.argv[4]) if len(sys.argv) > 4 else 60
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive", OMPI_MCA_mpi_yield_when_idle="1",
           PENTAD_INJECT_EVERY_ATTEMPT="1")
ENV.pop("PENTAD_MONITOR", None)
COMMON = ["train.eval_every=0", "train.threads=1", "data.source=random", "train.seq_len=32",
          "train.log_every=1000", "train.save_every=5", "train.global_batch=16"]
SLOW = "train.inject_fault=slowlink:1:2:2:20"
CANDIDATES = {
    "dp4 mb2 ga2": ["parallel.dp=4", "train.micro_batch=2", "train.grad_accum=2"],
    "tp2 dp2 mb2 ga4": ["parallel.tp=2", "parallel.dp=2", "train.micro_batch=2",
                        "train.grad_accum=4"],
    "pp2 1f1b dp2 mb2 ga4": ["parallel.pp=2", "parallel.dp=2", "train.micro_batch=2",
                             "train.grad_accum=4"],
    "pp2 zb-h1 dp2 mb4 ga2 z1": ["parallel.pp=2", "parallel.pp_schedule=zb-h1",
                                 "parallel.dp=2", "parallel.zero=1", "train.micro_batch=4",
                                 "train.grad_accum=2"],
    "pp2 zb-h1 dp2 mb8 ga1 z1": ["parallel.pp=2", "parallel.pp_schedule=zb-h1",
                                 "parallel.dp=2", "parallel.zero=1", "train.micro_batch=8",
                                 "train.grad_accum=1"],
    "pp2 zb-h1 dp2 mb2 ga4 z1": ["parallel.pp=2", "parallel.pp_schedule=zb-h1",
                                 "parallel.dp=2", "parallel.zero=1", "train.micro_batch=2",
                                 "train.grad_accum=4"],
    "tp4 mb4 ga4": ["parallel.tp=4", "train.micro_batch=4", "train.grad_accum=4"],
    "tp2 pp2 mb2 ga8": ["parallel.tp=2", "parallel.pp=2", "train.micro_batch=2",
                        "train.grad_accum=8"],
}


def cmd(out, keys):
    c = ["mpirun", "--oversubscribe", "-np", "4", PENTAD, "train", RECIPE]
    for k in COMMON + keys + [f"train.steps={STEPS}", f"train.out_dir={out}"]:
        c += ["--set", k]
    return c


def steps_of(out):
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    last = {}
    for r in rows:
        if "loss" in r and "seconds" in r:
            last[r["step"]] = r["seconds"]  # a resumed attempt's steps replace the first's
    return last


def median_from(out, first):
    s = steps_of(out)
    return statistics.median(v for k, v in s.items() if k >= first)


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    print("| layout | step s, link slowed | step s, no slow link |")
    print("|---|---|---|")
    measured = {}
    for name, keys in CANDIDATES.items():
        row = []
        for slow in (True, False):
            out = os.path.join(WORK, name.replace(" ", "_") + ("_slow" if slow else ""))
            p = subprocess.run(cmd(out, keys + ([SLOW] if slow else [])), env=ENV,
                               capture_output=True, text=True, timeout=600)
            if p.returncode:
                errors = [l for l in p.stderr.splitlines() if "error" in l] or ["?"]
                row.append(f"failed ({errors[0][:100]})")
                continue
            row.append(median_from(out, 10))
        if isinstance(row[0], float):
            measured[name] = row[0]
        print(f"| {name} | " + " | ".join(f"{v:.4f}" if isinstance(v, float) else v
                                           for v in row) + " |")
    best = min(measured, key=measured.get)
    print(f"\nbest measured with the link slowed: {best}, {measured[best]:.4f} s a step")

    out = os.path.join(WORK, "launch")
    p = subprocess.run([PENTAD, "launch", "--replan", "--", *cmd(out, CANDIDATES["dp4 mb2 ga2"] +
                                                                     [SLOW])],
                       env=ENV, capture_output=True, text=True, timeout=900)
    print("\n".join(l for l in p.stdout.splitlines() if l.startswith("pentad launch")))
    events = [json.loads(l) for l in open(os.path.join(out, "events.jsonl"))]
    detection = next(e for e in events if e["event"] == "detection")
    replan = next(e for e in events if e.get("action") == "replan")
    resumed = next(e for e in events if e["event"] == "resumed")
    steps_between = (replan["t"] - detection["t"]) / detection["median_step_s"]
    after = median_from(out, resumed["resume_step"] + 10)
    print(f"\nreport to re-plan: {replan['t'] - detection['t']:.3f} s = {steps_between:.2f} "
          f"steps of {detection['median_step_s']:.3f} s; re-planned {replan['layout_before']} "
          f"-> {replan['layout_after']}; its median step after the resume {after:.4f} s, "
          f"{after / measured[best]:.2f}x the best measured ({best})")


if __name__ == "__main__":
    main()
