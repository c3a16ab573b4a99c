#!/usr/bin/env python3
"""Checkpoint cost: training time blocked per save, and throughput while saving.

Trains a GPT-2-124M-shaped model (1.5 GB of parameters + AdamW state) on one rank for a few
steps with no checkpoints, with a checkpoint every 10 steps and every step, each both
asynchronous (pentad's lazy saver) and synchronous (the peer: copy + write before the next
step). The configurations alternate, --reps times; reported figures are medians over the
repetitions: median step time, wall time of the steps after warm-up (saves included),
throughput against no checkpoints, and the seconds training was blocked per save (pentad
measures them; the last save, flushed at exit, is not counted), next to the disk's own
direct-I/O write bandwidth (dd).

usage: bench/checkpoint_bench.py [--steps 16] [--reps 2] [--dir /tmp/pentad-ckpt-bench]
"""
import argparse
import json
import shutil
import statistics
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 2


def run(args, name, save_every, asynchronous):
    out = Path(args.dir) / name
    shutil.rmtree(out, ignore_errors=True)
    sets = ["data.source=random", "train.micro_batch=1", "train.seq_len=128", "train.grad_accum=1",
            f"train.steps={args.steps}", "train.eval_every=0", "train.threads=2",
            f"train.out_dir={out}", f"train.save_every={save_every}", "train.keep_last=1",
            f"train.async_save={'true' if asynchronous else 'false'}"]
    subprocess.run([str(ROOT / "build/pentad"), "train", str(ROOT / "recipes/gpt2-124m.toml"), *sets],
                   check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["seconds"] for r in rows if "seconds" in r][WARMUP:]
    elapsed = [r["elapsed_seconds"] for r in rows if "elapsed_seconds" in r]
    wall = elapsed[-1] - elapsed[WARMUP - 1]  # steps after warm-up, saves included
    ck = [r for r in rows if "checkpoint_saves" in r]
    # Saves made while training (the last one, at the final step, is flushed at exit and
    # reported apart by pentad).
    blocked = ck[0]["checkpoint_blocked_seconds"] / max(1, ck[0]["checkpoint_saves"] - 1) if ck else 0.0
    saved = sum(f.stat().st_size for f in (out / "checkpoints").rglob("*.h5")) if ck else 0
    shutil.rmtree(out, ignore_errors=True)
    return statistics.median(steps), wall, blocked, saved


def disk_bandwidth(folder):
    target = Path(folder) / "dd.bin"
    out = subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", "count=1024", "oflag=direct"],
                         capture_output=True, text=True).stderr
    target.unlink(missing_ok=True)
    return out.strip().splitlines()[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/pentad-ckpt-bench")
    args = ap.parse_args()
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    print("disk (dd, 1 GiB, oflag=direct):", disk_bandwidth(args.dir))
    configs = [("none", 0, True), ("every10-async", 10, True), ("every10-sync", 10, False),
               ("every1-async", 1, True), ("every1-sync", 1, False)]
    runs = {name: [] for name, _, _ in configs}
    for rep in range(args.reps):  # alternate the configurations, rep after rep
        for name, every, asynchronous in configs:
            runs[name].append(run(args, name, every, asynchronous))
            median, wall, blocked, saved = runs[name][-1]
            print(f"rep {rep} {name:>14}: median step {median:.3f} s, wall {wall:.1f} s, "
                  f"blocked per save {blocked:.3f} s, checkpoint {saved / 2**30:.2f} GiB")
    # Medians over repetitions of each figure.
    results = {name: tuple(statistics.median(r[i] for r in rs) for i in range(4))
               for name, rs in runs.items()}
    base = results["none"][1]
    for name in ("every10-async", "every10-sync", "every1-async", "every1-sync"):
        print(f"throughput {name}: {base / results[name][1]:.2f} of no checkpoints")
    for every in ("every10", "every1"):
        a, s = results[f"{every}-async"][2], results[f"{every}-sync"][2]
        print(f"blocked per save {every}: async {a:.3f} s vs sync {s:.3f} s = {a / s:.1%}")


if __name__ == "__main__":
    main()
