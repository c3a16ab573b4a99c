#!/usr/bin/env python3
"""The step line's throughput (issue 45): tokens/s of the job and per device, model TFLOP/s
per device and MFU, counted as `pentad plan` counts them.

1. A calibration file with known GEMM rates (peak of the node: the larger of the all-core
   rate and one core's times the cores, 20 GFLOP/s; each of 2 ranks gets 10 GFLOP/s).
2. `pentad train` on 2 ranks with it: every step row of metrics.jsonl keeps the old fields
   (tokens_per_second, flops_per_second) and adds tokens_per_second_per_device (the job's
   over 2), flops_per_second_per_device and mfu (that over 10 GFLOP/s); the FLOPs a token
   (flops_per_device x 2 / tokens_per_second) equal `pentad plan --json`'s for the same
   recipe and so does the peak; the step line shows the same numbers, labelled.
3. Without a calibration: "MFU n/a (no calibration: run pentad plan --calibrate)" once, "MFU
   n/a" in the step lines, and no mfu field.
4. A calibration of a machine named "test", timed on busy cores (others_share 0.5) with other
   OpenBLAS kernels, whose peak the steps beat (1 MFLOP/s): the log says the table was timed
   while others used 50% of the cores, with those kernels and on that machine, and says once
   that a step ran above the peak, naming `pentad plan --calibrate`.

usage: step_throughput.py PENTAD RECIPE WORKDIR
Prints "step throughput matches the plan's counting" on success.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1")
SETS = ["train.steps=3", "train.log_every=1", "train.micro_batch=2", "train.seq_len=16",
        "train.threads=1", "data.source=random", "train.eval_every=0"]
PEAK_PER_RANK = 10e9


def calibration(path, scale=1.0, others_share=0.0, **extra):
    def rates(threads, gemm):
        return {"threads": threads, "gemm": [{"flops": 1e6, "flops_per_s": gemm / 2},
                                             {"flops": 1e9, "flops_per_s": gemm}],
                "attention_flops_per_s": 5e9, "attention_by_keys": [],
                "elementwise_bytes_per_s": 1e10, "adamw_params_per_s": 1e9,
                "copy_bytes_per_s": 1e10, "others_share": others_share}
    # One core 10 GFLOP/s (x 2 cores = 20), both 16: the node's peak is 20 GFLOP/s.
    path.write_text(json.dumps({"machine": "test", "cores": 2, **extra,
                                "rates": [rates(1, 10e9 * scale), rates(2, 16e9 * scale)]}))


def close(a, b, rel=1e-6):
    return abs(a - b) <= rel * max(abs(a), abs(b))


def train(pentad, recipe, out, env):
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", pentad, "train", recipe,
           *SETS, f"train.out_dir={out}"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        sys.exit(f"train failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    return run.stdout + run.stderr, [r for r in rows if "loss" in r]


def main():
    pentad, recipe, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    failures = []
    cal = work / "calibration.json"
    calibration(cal)
    env = dict(ENV, PENTAD_CALIBRATION=str(cal))

    plan = json.loads(subprocess.run(
        [pentad, "plan", recipe, "--ranks", "2", "--json", "--layout", "tp=1,pp=1,dp=2",
         *[s for s in SETS if not s.startswith("train.threads")]],
        env=env, capture_output=True, text=True, check=True).stdout)
    row = plan["rows"][0]
    plan_per_token = row["flops_per_device"] * 2 / row["tokens_per_second"]
    if not close(plan["peak_flops_per_device"], PEAK_PER_RANK):
        failures.append(f"plan's peak {plan['peak_flops_per_device']}, expected {PEAK_PER_RANK}")

    log, steps = train(pentad, recipe, work / "calibrated", env)
    lines = [l for l in log.splitlines() if re.search(r"step +\d+/3 \| loss", l)]
    if len(steps) != 3 or len(lines) != 3:
        failures.append(f"{len(steps)} step rows, {len(lines)} step lines")
    for s, line in zip(steps, lines):
        for old in ("tokens_per_second", "flops_per_second", "seconds", "loss"):
            if old not in s:
                failures.append(f"step {s['step']}: {old} is gone")
        per_device = s.get("tokens_per_second_per_device", 0)
        flops = s.get("flops_per_second_per_device", 0)
        if not close(per_device * 2, s["tokens_per_second"]):
            failures.append(f"step {s['step']}: {per_device} per device x 2 != "
                            f"{s['tokens_per_second']}")
        if not close(flops * 2 / s["tokens_per_second"], plan_per_token):
            failures.append(f"step {s['step']}: {flops * 2 / s['tokens_per_second']:.6g} FLOPs a "
                            f"token, the plan counts {plan_per_token:.6g}")
        if not close(s.get("mfu", -1), flops / PEAK_PER_RANK):
            failures.append(f"step {s['step']}: mfu {s.get('mfu')}, expected {flops / 10e9}")
        want = (f"{s['tokens_per_second']:.0f} tokens/s ({per_device:.0f} per device) | "
                f"{flops / 1e12:.3g} TFLOP/s per device | MFU {100 * flops / PEAK_PER_RANK:.1f}%")
        # The printed figures are rounded from the same doubles: compare the labels and the MFU.
        got = line.split("grad norm")[1]
        if "tokens/s (" not in got or "per device) |" not in got or \
                "TFLOP/s per device | MFU " not in got or want.split("MFU ")[1] not in got:
            failures.append(f"step line {got!r}, expected like {want!r}")
    if "MFU against this machine's measured peak" not in log:
        failures.append("no line says what MFU is against")

    log, steps = train(pentad, recipe, work / "uncalibrated",
                       dict(ENV, PENTAD_CALIBRATION=str(work / "none.json")))
    if "MFU n/a (no calibration: run pentad plan --calibrate)" not in log:
        failures.append("without a calibration the log does not say why there is no MFU")
    if any("mfu" in s for s in steps) or log.count("| MFU n/a") != 3:
        failures.append("without a calibration: an mfu field, or step lines without MFU n/a")

    busy = work / "busy.json"
    # A peak of 1 MFLOP/s a rank, timed with kernels this process does not run.
    calibration(busy, scale=1e-4, others_share=0.5, blas_core="NoSuchCore")
    log, steps = train(pentad, recipe, work / "busy", dict(ENV, PENTAD_CALIBRATION=str(busy)))
    if f"calibration {busy} was timed while other processes used 50% of the cores" not in log:
        failures.append("a calibration timed on busy cores is not named as such")
    if log.count("is above the peak MFU is against") != 1 or \
            "rerun `pentad plan --calibrate` on this machine while it is idle" not in log:
        failures.append("steps above the calibrated peak: not said exactly once")
    if f"calibration {busy} was timed with OpenBLAS's NoSuchCore kernels" not in log:
        failures.append("a calibration of other OpenBLAS kernels is not named as such")
    if f"calibration {busy} was timed on test, and this is {socket.gethostname()}" not in log:
        failures.append("a calibration of another machine is not named as such")
    print("\n".join(lines))
    if failures:
        sys.exit("\n".join(failures))
    print("step throughput matches the plan's counting")


if __name__ == "__main__":
    main()
