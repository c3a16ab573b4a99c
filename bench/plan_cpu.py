#!/usr/bin/env python3
"""`pentad plan` against measured step times on this CPU machine: for each layout of 8 ranks,
the planner's predicted step (`pentad plan --ranks 8 --layout <every field> --json`) and the
median measured step of `pentad train` on those ranks (mpirun --oversubscribe), then the
Spearman rank correlation and how far the predicted best is from the measured best.

usage: plan_cpu.py PENTAD RECIPE WORKDIR [--set ci|full|tp] [--steps N] [--sim-nodes R:LAT_US:GBS]
                   [--topology FILE | --probe] [--repeat K] [--no-bind] [--hosts K:RATE]
Prints a Markdown table; ends with "spearman X best-gap Y" (exit 1 when X < 0.9 or Y > 10%).
Needs the calibration file (`pentad plan --calibrate`; made here when missing). --probe runs
`pentad probe --quick` on the same 8 ranks (and simulated nodes) first and plans with its
topology file.

--hosts K:RATE runs every rank over K hosts on this machine joined by real links capped at RATE
(scripts/hosts.sh, root only: Open MPI's TCP between the hosts, 8/K ranks a host, --probe
implied), instead of simulated nodes. --set tp: tp 8's shapes (1D, 2x4, 4x2, 8x1 and the
planner's auto) and the CI's ten.

The ranks are bound to the cores in turn (mpirun --bind-to core: rank r on core r mod cores)
unless --no-bind: 8 ranks on 2 cores left to the kernel land on cores differently from run to
run, and the same 20 layouts measured three times agreed with each other at Spearman 0.81-0.83
unbound, 0.92 bound (bench/RESULTS.md).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

# Every field named: the planner predicts that layout as is. Global batch 8 sequences a
# step (the recipe's micro_batch 1 x grad_accum 1 x dp 8), so mb x ga x dp = 8.
DEFAULTS = dict(tp_shape="", tp_order="row", tp_chunks=1, sp="false", cp=1, cp_impl="ring",
                cp_ulysses=1, pp=1, schedule="1f1b", vp=1, pp_group=2, ep=1, etp=1, zero=0,
                offload="none", recompute="false")
CI = [  # the CI's ten: every kind of layout, spread from 0.45 to 1.3 s a step here
    dict(tp=2, sp="true", dp=4, mb=2, ga=1),
    dict(tp=1, dp=8, mb=1, ga=1, zero=1, recompute="true"),
    dict(tp=1, pp=2, schedule="interleaved", vp=2, dp=4, mb=1, ga=2, recompute="true"),
    dict(tp=4, tp_shape="1x4", dp=2, mb=2, ga=2),
    dict(tp=8, tp_shape="1x8", dp=1, mb=4, ga=2),
    dict(tp=1, pp=4, dp=2, mb=1, ga=4),
    dict(tp=1, dp=8, mb=1, ga=1),
    dict(tp=2, cp=2, cp_impl="ulysses", dp=2, mb=1, ga=4),
    dict(tp=1, cp=4, cp_impl="ring", dp=2, mb=2, ga=2),
    dict(tp=4, tp_shape="2x2", dp=2, mb=2, ga=2),
]
TP = [  # tp over all 8 ranks in every shape, then the auto shape the planner picks
    dict(tp=8, tp_shape="1x8", dp=1, mb=4, ga=2),
    dict(tp=8, tp_shape="2x4", dp=1, mb=4, ga=2),
    dict(tp=8, tp_shape="4x2", dp=1, mb=4, ga=2),
    dict(tp=8, tp_shape="8x1", dp=1, mb=4, ga=2),
    dict(tp=8, tp_shape="auto", dp=1, mb=4, ga=2),
] + CI
FULL = CI + [
    dict(tp=8, dp=1, mb=4, ga=2),
    dict(tp=1, dp=8, mb=1, ga=1, zero=1),
    dict(tp=1, dp=8, mb=1, ga=1, recompute="true"),
    dict(tp=2, dp=4, mb=1, ga=2),
    dict(tp=4, dp=2, mb=4, ga=1),
    dict(tp=1, pp=2, dp=4, mb=1, ga=2),
    dict(tp=1, pp=2, schedule="interleaved", vp=2, dp=4, mb=1, ga=2),
    dict(tp=1, cp=2, cp_impl="ring", dp=4, mb=1, ga=2),
    dict(tp=2, pp=2, dp=2, mb=1, ga=4),
    dict(tp=1, dp=8, mb=1, ga=1, zero=2),
]


def layout_spec(fields):
    f = dict(DEFAULTS, **fields)
    if not f["tp_shape"]:
        f["tp_shape"] = f"{f['tp']}x1"  # 1D
    if f["tp_shape"] == "auto":  # left to the search, which picks among the shapes
        del f["tp_shape"]
    return ",".join(f"{k}={v}" for k, v in f.items())


def label(fields):
    return " ".join(f"{k}={v}" for k, v in fields.items())


def spearman(xs, ys):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):  # ties share their mean rank
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pentad")
    ap.add_argument("recipe")
    ap.add_argument("work")
    ap.add_argument("--set", default="full", choices=["ci", "full", "tp"])
    ap.add_argument("--hosts", default="", help="K:RATE: K hosts over links capped at RATE")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=1, help="measure every layout K times, in turn")
    ap.add_argument("--sim-nodes", default="")
    ap.add_argument("--topology", default="")
    ap.add_argument("--calibration", default="")
    ap.add_argument("--probe", action="store_true",
                    help="plan with the topology `pentad probe --quick` measures first")
    ap.add_argument("--no-bind", action="store_true",
                    help="leave the ranks unbound (the kernel places them)")
    a = ap.parse_args()
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = dict(ENV)
    env.pop("PENTAD_SIM_NODES", None)
    if a.sim_nodes:
        env["PENTAD_SIM_NODES"] = a.sim_nodes
    cal = ["--calibration", a.calibration] if a.calibration else []
    # A missing file, or one pentad says to time again (another machine, other OpenBLAS
    # kernels, one older than their record, a busy machine's), is made afresh.
    stale = bool(a.calibration) and not Path(a.calibration).exists()
    if not stale:
        p = subprocess.run([a.pentad, "plan", a.recipe, "--ranks", "8", "--top", "1", *cal],
                           env=env, capture_output=True, text=True)
        stale = "--calibrate" in p.stdout + p.stderr
    if stale:
        subprocess.run([a.pentad, "plan", "--calibrate", *cal], check=True, env=env)
    bind = [] if a.no_bind else ["--bind-to", "core:overload-allowed", "--map-by", "core"]
    mpirun = ["mpirun", "-q", "--oversubscribe", *bind, "-np", "8"]
    hosts_sh = Path(__file__).resolve().parent.parent / "scripts" / "hosts.sh"
    if a.hosts:
        count, rate = a.hosts.split(":")
        env["PENTAD_HOSTS"] = "pentadb"
        env.update(OMP_WAIT_POLICY="passive", OMPI_MCA_mpi_yield_when_idle="1")
        subprocess.run(["bash", hosts_sh, "down"], env=env, check=True)
        subprocess.run(["bash", hosts_sh, "up", count, rate, "--ttl", "3600"], env=env, check=True)
        mpirun = ["bash", str(hosts_sh), "mpirun", "-q", "-np", "8", "--npernode",
                  str(8 // int(count))]
        a.probe = True
    try:
        return measure(a, env, mpirun, work, cal)
    finally:
        if a.hosts:
            subprocess.run(["bash", hosts_sh, "down"], env=env)


def measure(a, env, mpirun, work, cal):
    if a.probe:
        a.topology = str(work / "topology.json")
        subprocess.run([*mpirun, a.pentad, "probe", "--quick", "-o", a.topology], check=True,
                       env=env, capture_output=True, text=True)
    topo = ["--topology", a.topology] if a.topology else []
    layouts = {"ci": CI, "full": FULL, "tp": TP}[a.set]
    rows = []
    for fields in layouts:
        auto = ["--top", "1"] if fields.get("tp_shape") == "auto" else []
        p = subprocess.run([a.pentad, "plan", a.recipe, "--ranks", "8", "--json", "--layout",
                            layout_spec(fields), *auto, *cal, *topo],
                           env=env, capture_output=True, text=True)
        if p.returncode != 0:
            print(f"plan refused {label(fields)}: {p.stdout}{p.stderr}")
            return 1
        if fields.get("tp_shape") == "auto":  # as the planner chose it
            print(f"  tp_shape auto: {json.loads(p.stdout)['rows'][0]['layout']}")
        plan = json.loads(p.stdout)
        assert len(plan["rows"]) == 1 or auto, plan["rows"]
        row = plan["rows"][0]
        overrides = [f"{k}={json.dumps(v) if isinstance(v, str) and not v.isdigit() and v not in ('true', 'false') else v}"
                     for k, v in row["overrides"].items()]
        rows.append(dict(fields=fields, layout=row["layout"], predicted=row["step_seconds"],
                         overrides=overrides, times=[]))
    for rep in range(a.repeat):
        for i, r in enumerate(rows):
            out = work / f"layout{i}"
            cmd = [*mpirun, a.pentad, "train", a.recipe, *r["overrides"],
                   f"train.steps={a.steps}", f"train.out_dir={out}"]
            t0 = time.monotonic()
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                print(f"train failed for {r['layout']}:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
                return 1
            steps = [json.loads(l) for l in open(out / "metrics.jsonl") if '"seconds"' in l]
            secs = [s["seconds"] for s in steps if "seconds" in s][1:]  # the first warms up
            r["times"].append(statistics.median(secs))
            print(f"  {r['layout']}: {statistics.median(secs):.3f} s a step "
                  f"({time.monotonic() - t0:.1f} s run)", flush=True)
    for r in rows:
        r["measured"] = statistics.median(r["times"])
    pred = [r["predicted"] for r in rows]
    meas = [r["measured"] for r in rows]
    rho = spearman(pred, meas)
    best_pred = min(rows, key=lambda r: r["predicted"])
    best_meas = min(rows, key=lambda r: r["measured"])
    gap = best_pred["measured"] / best_meas["measured"] - 1
    print("\n| layout | predicted s | measured s | predicted rank | measured rank |")
    print("|---|---:|---:|---:|---:|")
    pr = sorted(range(len(rows)), key=lambda i: pred[i])
    mr = sorted(range(len(rows)), key=lambda i: meas[i])
    for i, r in enumerate(rows):
        print(f"| {r['layout']} | {r['predicted']:.3f} | {r['measured']:.3f} | "
              f"{pr.index(i) + 1} | {mr.index(i) + 1} |")
    print(f"\npredicted best: {best_pred['layout']} (measured {best_pred['measured']:.3f} s); "
          f"measured best: {best_meas['layout']} ({best_meas['measured']:.3f} s)")
    if a.repeat > 1:  # how well the measurement agrees with itself: the ceiling for the model
        pairs = [spearman([r["times"][i] for r in rows], [r["times"][j] for r in rows])
                 for i in range(a.repeat) for j in range(i + 1, a.repeat)]
        print(f"repetitions against each other: spearman {min(pairs):.3f}..{max(pairs):.3f}")
    print(f"spearman {rho:.3f} best-gap {100 * gap:.1f}%")
    ok = rho >= 0.9 and gap <= 0.10
    print("plan ranks the layouts as measured" if ok else
          "FAIL: rank correlation below 0.9 or predicted best over 10% from the measured best")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
