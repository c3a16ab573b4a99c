#!/usr/bin/env python3
"""ZeRO on CPU ranks: per-rank memory of stages 0-3 at dp 1, 2, 4, 8 against the formulas.

Trains a GPT-2 whose state dominates its activations (gpt-tiny widened: 8 layers, width 512,
8 heads, vocabulary 8192, micro-batch 2 x 32 tokens: 29.4M values, 112 MiB of parameters)
for a few steps on random tokens, one thread per rank, under every (dp, parallel.zero).
For each run it reports, per rank (Z = dp when zero > 0 and dp > 1, else 1; S = N / Z):
  formula  README's per-rank bytes of parameters + gradients + AdamW m, v:
             stage 0  4N + 4N + 8N
             stage 1  4N + (4N + 4S) + 8S
             stage 2  4N + (2 buckets + 4S) + 8S
             stage 3  (4S + 2 adjacent units) + (2 units + 4S) + 8S
           with N the values the run's memory plan names, a bucket the larger of
           parallel.bucket_mb and the embedding (a parameter is never split: the tied
           embedding's V C values make a bucket of their own), and a unit the larger of a
           layer (12C^2 + 13C values) and the embedding unit ((V + max_seq_len) C); two
           adjacent units, the stretch computing and the next one prefetched (a layer and
           the embedding unit here), each whole in a buffer of its own;
  plan     the same three figures from the memory plan the run prints at start (the real
           arena sizes, the largest over ranks where they differ);
  acts     the activations from the same line (small here, not part of the formula);
  RSS      two peaks of resident memory per rank (min..max over ranks):
             whole run     pentad's closing line (getrusage), which includes start-up;
             after step 1  each rank's high-water mark reset (5 into /proc/PID/clear_refs)
                           once rank 0 logs step 1, and read (VmHWM) until it exits: the
                           steady state of steps 2 on, start-up excluded;
           each less a baseline: the same figure for the same launch (ranks, threads,
           batch) with gpt-tiny's own 0.1M-value model, less that run's plan total;
  ratio    (RSS max - baseline) / (formula + acts), for both peaks.
At dp 1 ZeRO has nothing to shard (Z = 1; pentad runs stage 0): the formula is stage 0's.
Eight ranks on two cores are slow but fine for memory: each rank needs about 0.5 GiB.
Resetting high-water marks needs root (or the ranks' own user).

--shape gpt2-124m runs GPT-2 124M's shape instead (recipes/gpt2-124m.toml: 12 layers, width
768, vocabulary 50257, tied head, 124.4M values; micro-batch 1 x 32 tokens) and adds FSDP's
per-rank formula beside README's (fp32 throughout, U the largest unit, here the root unit
that FSDP2 makes of the embedding, position table and final norm, 150 MiB):
  FSDP     FULL_SHARD (zero 3): 16N/Z + 2U gathered (the unit computing and the one
           prefetched) + 2U of unsharded gradients (the unit's and the one reduce-scattering);
           SHARD_GRAD_OP (zero 2): 4N + 12N/Z + 2U; NO_SHARD (zero 0, DDP): 16N + 2 buckets;
           stage 1 has no FSDP counterpart.
--timing runs zero 1, zero 3 with parallel.zero_live_units = 2 (prefetch on) and zero 3 with
1 (off), A B C A B C ..., --reps times at the first of --dps, and reports each one's median
step time (steps after the first, from metrics.jsonl) and its spread
(min..max over repetitions), and the ratios of the medians against zero 1.

usage: /usr/bin/python3 bench/zero_memory.py [--pentad build/pentad] [--steps 4]
           [--dps 1,2,4,8] [--stages 0,1,2,3] [--shape tiny|gpt2-124m] [--live-units 2]
           [--timing --reps 3] [--work bench/out/zero_memory]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": MiB, "GiB": 1 << 30, "TiB": 1 << 40}
COMMON = {"train.micro_batch": 2, "train.seq_len": 32, "train.grad_accum": 1,
          "train.eval_every": 0, "train.threads": 1, "train.log_every": 1,
          "data.source": "random"}
MODEL = {"model.n_layer": 8, "model.d_model": 512, "model.n_head": 8, "model.vocab_size": 8192}
MAX_SEQ_LEN = 64  # recipes/gpt-tiny.toml's: the position table sits in the embedding unit
RECIPE = "recipes/gpt-tiny.toml"
# GPT-2 124M's shape: the recipe's model (max_seq_len 1024 in the embedding unit), a short
# sequence so that a step on 4 oversubscribed ranks takes seconds.
SHAPES = {
    "tiny": (RECIPE, MODEL, MAX_SEQ_LEN, {}),
    "gpt2-124m": ("recipes/gpt2-124m.toml", {"model.n_layer": 12, "model.d_model": 768,
                                             "model.n_head": 12, "model.vocab_size": 50257},
                  1024, {"train.micro_batch": 1}),
}


def parse_bytes(text):
    value, unit = text.split()
    return float(value) * UNITS[unit]


def rank_pids(out):
    """The pentad processes of the run writing to out (each rank's command line names it)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if proc.name.isdigit() and argv[0].endswith(b"pentad") and \
                f"train.out_dir={out}".encode() in argv:
            pids.append(int(proc.name))
    return pids


def mpi_rank(pid):
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(e for e in environ if e.startswith(b"OMPI_COMM_WORLD_RANK=")).split(b"=")[1])


def high_water(pid):
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"VmHWM:\s+(\d+) kB", status)  # none once the rank has exited (a zombie)
    return int(m.group(1)) * 1024 if m else None


def run(pentad, ranks, keys, out, recipe=RECIPE):
    """Runs pentad; the memory plan, the whole run's peak RSS (pentad's own line) and the
    steady-state peak: each rank's high-water mark reset once step 1 is logged (writing 5
    to /proc/PID/clear_refs), then read from /proc/PID/status until the rank exits."""
    shutil.rmtree(out, ignore_errors=True)
    keys = dict(COMMON, **keys, **{"train.out_dir": out})
    cmd = (["mpirun", "--oversubscribe", "-np", str(ranks), str(pentad), "train",
            str(ROOT / recipe)] +
           [x for k, v in keys.items() for x in ("--set", f"{k}={v}")])
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    env.pop("PENTAD_POISON", None)  # poison touches every page and would hide the savings
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    steady, ranks_of = {}, {}  # pid -> the last high-water mark read since the reset, rank
    done = threading.Event()

    def watch():
        while not done.wait(0.05):
            for pid in list(steady):
                hwm = high_water(pid)
                if hwm is not None:
                    steady[pid] = hwm
    watcher = threading.Thread(target=watch)
    lines = []
    for line in p.stdout:
        lines.append(line)
        if not steady and re.search(r"step\s+1/", line):
            pids = rank_pids(out)
            assert len(pids) == ranks, f"found {len(pids)} pentad processes, want {ranks}"
            for pid in pids:
                ranks_of[pid] = mpi_rank(pid)
                Path(f"/proc/{pid}/clear_refs").write_text("5")
                steady[pid] = high_water(pid)
            watcher.start()
    p.wait()
    done.set()
    watcher.join()
    text = "".join(lines)
    if p.returncode != 0 or not steady:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{text[-3000:]}")
    plans = [line for line in text.splitlines() if "memory plan (this rank" in line]

    def field(name):
        return max(parse_bytes(re.search(name + r" ([\d.]+ \w+)", line).group(1))
                   for line in plans)
    m = re.search(r"peak resident memory per rank: (\d+) to (\d+) MiB", text)
    return dict(values=int(re.search(r"\((\d+) values", plans[0]).group(1)),
                params=field("parameters"), grads=field("gradients"),
                optim=field("AdamW state"), acts=field("activations"), total=field("total"),
                rss=(int(m.group(1)) * MiB, int(m.group(2)) * MiB),
                steady=(min(steady.values()), max(steady.values())),
                by_rank=[steady[pid] for pid in sorted(steady, key=ranks_of.get)],
                cmd=" ".join(cmd))


def formula(n, z, stage, unit_bytes, pair_bytes, bucket_bytes):
    """README's parameters, gradients and AdamW bytes on one rank (stage 0 where z = 1)."""
    s = n / z
    bucket = unit_bytes if stage == 3 else bucket_bytes
    params = 4 * n if stage < 3 else 4 * s + min(4 * n, pair_bytes)
    grads = 4 * n if stage == 0 else 4 * n + 4 * s if stage == 1 else (
        min(4 * n, 2 * bucket) + 4 * s)
    return params, grads, 8 * s


def fsdp(n, z, stage, unit_bytes, bucket_bytes):
    """FSDP's per-rank bytes (fp32 parameters, gradients, Adam m and v), or None (stage 1)."""
    if z == 1 or stage == 0:
        return 16 * n + 2 * bucket_bytes
    if stage == 1:
        return None
    if stage == 2:
        return 4 * n + 12 * n / z + 2 * unit_bytes
    return 16 * n / z + 4 * unit_bytes


def timing(args, recipe, model, common):
    """Step time of zero 1 and zero 3 with prefetch on (2 live units) and off (1)."""
    dp = int(args.dps.split(",")[0])
    variants = [("zero 1", {"parallel.zero": 1}),
                ("zero 3, live units 2", {"parallel.zero": 3, "parallel.zero_live_units": 2}),
                ("zero 3, live units 1", {"parallel.zero": 3, "parallel.zero_live_units": 1})]
    seconds = {name: [] for name, _ in variants}
    for rep in range(args.reps):
        for name, extra in variants:
            keys = dict(model, **common, **extra, **{"train.steps": args.steps,
                                                      "parallel.dp": dp})
            out = Path(args.work) / f"time-{rep}-{name.replace(' ', '').replace(',', '-')}"
            r = run(args.pentad, dp, keys, out, recipe)
            rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            later = [row["seconds"] for row in rows if "seconds" in row][1:]  # after the first
            seconds[name].append(statistics.median(later))
            print(f"<!-- {name}, repetition {rep + 1}: {' '.join(f'{x:.2f}' for x in later)}"
                  f" s; {r['cmd']} -->", flush=True)
    base = statistics.median(seconds["zero 1"])
    print(f"| dp {dp} | median step s | min..max s | median / zero 1 |")
    print("|---|---:|---:|---:|")
    for name, _ in variants:
        t = seconds[name]
        print(f"| {name} | {statistics.median(t):.2f} | {min(t):.2f}..{max(t):.2f} | "
              f"{statistics.median(t) / base:.3f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pentad", default=str(ROOT / "build/pentad"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dps", default="1,2,4,8")
    ap.add_argument("--stages", default="0,1,2,3")
    ap.add_argument("--bucket-mb", type=float, default=4.0)
    ap.add_argument("--work", default=str(ROOT / "bench/out/zero_memory"))
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--live-units", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--timing", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    recipe, model, max_seq_len, common = SHAPES[args.shape]
    common = dict(COMMON, **common, **{"train.seq_len": args.seq_len})
    if args.timing:
        return timing(args, recipe, model, common)
    c, v = model["model.d_model"], model["model.vocab_size"]
    layer_bytes = 4 * (12 * c * c + 13 * c)
    embedding_bytes = 4 * v * c
    unit_bytes = max(layer_bytes, embedding_bytes + 4 * max_seq_len * c)
    # Units whole at once: the stretch computing and, with 2 live units, the next one.
    pair_bytes = (layer_bytes if args.live_units > 1 else 0) + unit_bytes
    bucket_bytes = max(args.bucket_mb * MiB, embedding_bytes)
    print(f"model: {' '.join(f'{k}={v}' for k, v in {**model, **common}.items())}; "
          f"{args.steps} steps; one layer {layer_bytes / MiB:.1f} MiB; "
          f"bucket {bucket_bytes / MiB:.1f} MiB; unit {unit_bytes / MiB:.1f} MiB")
    print("| dp | zero | formula P + G + O MiB | plan P + G + O MiB | FSDP MiB | acts MiB | "
          "peak RSS, whole run MiB | RSS after step 1 MiB | baseline MiB | "
          "after step 1 - baseline | / (formula + acts) | / (plan total) | "
          "whole run - baseline | / (formula + acts) |")
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for dp in (int(x) for x in args.dps.split(",")):
        # The baseline: gpt-tiny's own 0.1M-value model under the same launch.
        base = run(args.pentad, dp, dict(common, **{"train.steps": args.steps}),
                   work / f"base-dp{dp}")
        baseline = (base["steady"][1] - base["total"], base["rss"][1] - base["total"])
        print(f"<!-- baseline: {base['cmd']} -->")
        for stage in (int(x) for x in args.stages.split(",")):
            keys = dict(model, **common, **{"train.steps": args.steps, "parallel.dp": dp,
                                            "parallel.zero": stage,
                                            "parallel.bucket_mb": args.bucket_mb})
            if stage == 3 and dp > 1:
                keys["parallel.zero_live_units"] = args.live_units
            r = run(args.pentad, dp, keys, work / f"dp{dp}-zero{stage}", recipe)
            z = dp if stage > 0 else 1
            f = formula(r["values"], z, stage if z > 1 else 0, unit_bytes, pair_bytes,
                        bucket_bytes)
            plan = (r["params"], r["grads"], r["optim"])
            want = sum(f) + r["acts"]
            full = fsdp(r["values"], z, stage, unit_bytes, bucket_bytes)
            steady, whole = r["steady"][1] - baseline[0], r["rss"][1] - baseline[1]
            print(f"<!-- {r['cmd']} -->")
            print(f"<!-- after step 1, by rank (MiB): "
                  f"{' '.join(str(round(x / MiB)) for x in r['by_rank'])} -->")
            print(f"| {dp} | {stage} | {sum(f) / MiB:.1f} = "
                  f"{' + '.join(f'{x / MiB:.1f}' for x in f)} | {sum(plan) / MiB:.1f} = "
                  f"{' + '.join(f'{x / MiB:.1f}' for x in plan)} | "
                  f"{'—' if full is None else f'{full / MiB:.1f}'} | {r['acts'] / MiB:.1f} | "
                  f"{r['rss'][0] / MiB:.0f}..{r['rss'][1] / MiB:.0f} | "
                  f"{r['steady'][0] / MiB:.0f}..{r['steady'][1] / MiB:.0f} | "
                  f"{baseline[0] / MiB:.0f} | {steady / MiB:.0f} | {steady / want:.3f} | "
                  f"{steady / r['total']:.3f} | "
                  f"{whole / MiB:.0f} | {whole / want:.3f} |", flush=True)

if __name__ == "__main__":
    main()
