#!/usr/bin/env python3
"""Checkpoint cost: training time blocked per save, and throughput while saving.

Trains a GPT-2-124M-shaped model (1.5 GB of parameters + AdamW state) on one rank with
2 compute threads, with no checkpoints and with a checkpoint every 10 steps and every step,
each with these ways of taking a snapshot (train.keep_last = 1):
  swap   checkpoint.snapshot = "swap": the optimizer step after a save writes a second set of
         the state; the saver thread checksums and writes the first where it lies;
  copy   checkpoint.snapshot = "copy": the lazy copy into host staging, which the optimizer
         follows chunk by chunk;
  fresh  the copy with checkpoint.recycle_files = false: each file newly allocated and the
         retired one deleted (the others write over the retired checkpoint's files);
  sync   train.async_save = false: copy and write before the next step (the peer).
  memory the copy, and in between the files the in-memory level every step
         (checkpoint.memory_every = 1: a lazy copy into /dev/shm; every 10 steps only).
The configurations alternate, --reps times. pentad logs the seconds each step was blocked
by checkpoints (`blocked_seconds`, the save's own start included); a save's blocking is that
of the steps from it to the next save (whose start waits for its file). The first save is
reported apart; the warm saves (at least 3 for every 10 steps at the default --steps) give
the median and the maximum. Throughput: wall time of the steps after the first save
against the same steps of the run without checkpoints. The saver's thread shares the cores
with the 2 compute threads: the bench prints how many the machine has. Next to the figures:
the disk's direct-I/O write bandwidth (dd), and the bound it sets on saving every step
(state bytes / bandwidth against the step time).

usage: bench/checkpoint_bench.py [--steps 45] [--steps-every1 12] [--reps 1] [--every 10,1]
                                 [--modes swap,copy,fresh,memory,sync] [--dir /tmp/pentad-ckpt-bench]
                                 [--pentad build/pentad]
(--every 10: only the save intervals listed, here every 10 steps; --modes: only these ways of
taking the snapshot, sync always among them as the peer)
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 2


def run(args, save_every, mode):
    name = f"every{save_every}-{mode}" if save_every else "none"
    out = Path(args.dir) / name
    shutil.rmtree(out, ignore_errors=True)
    steps = args.steps_every1 if save_every == 1 else args.steps
    sets = ["data.source=random", "train.micro_batch=1", "train.seq_len=128", "train.grad_accum=1",
            f"train.steps={steps}", "train.eval_every=0", "train.threads=2",
            f"train.out_dir={out}", f"train.save_every={save_every}", "train.keep_last=1",
            f"train.async_save={'false' if mode == 'sync' else 'true'}",
            f"checkpoint.snapshot={'swap' if mode == 'swap' else 'copy'}",
            # "fresh": the copy, with every file newly allocated and the retired one deleted
            f"checkpoint.recycle_files={'false' if mode == 'fresh' else 'true'}",
            f"checkpoint.memory_every={1 if mode == 'memory' else 0}"]
    subprocess.run([args.pentad, "train", str(ROOT / "recipes/gpt2-124m.toml"), *sets],
                   check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps_rows = [r for r in rows if "seconds" in r]
    saved = sum(f.stat().st_size for f in (out / "checkpoints").rglob("*.h5")) if save_every else 0
    shutil.rmtree(out, ignore_errors=True)
    # The saver thread's CPU seconds per save (copy with checksums, then the write), the
    # first save left out: what it took from the compute threads on shared cores.
    saver = [r["saver_copy_cpu_seconds"] + r["saver_write_cpu_seconds"] for r in rows
             if "saver_copy_cpu_seconds" in r][1:]
    return steps_rows, saved, saver


def per_save(rows, save_every):
    """Blocked seconds of each save made while training (not the last, flushed at exit)."""
    # Row t holds step t's optimizer (which may wait for the copy of the save before it),
    # and its own save's start (which waits for the previous save's file): save k is
    # charged the rows after it up to and including the next save's.
    blocked = {r["step"]: r.get("blocked_seconds", 0.0) for r in rows}
    last = rows[-1]["step"]
    saves = list(range(save_every, last, save_every))
    ends = saves[1:] + [last]
    return [sum(blocked[t] for t in range(s + 1, e + 1)) for s, e in zip(saves, ends)]


def window_wall(rows, first):
    """Wall seconds of the steps after step `first`."""
    elapsed = {r["step"]: r["elapsed_seconds"] for r in rows}
    return elapsed[rows[-1]["step"]] - elapsed[first]


def disk_bandwidth(folder):
    target = Path(folder) / "dd.bin"
    out = subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", "count=1024", "oflag=direct"],
                         capture_output=True, text=True).stderr
    target.unlink(missing_ok=True)
    line = out.strip().splitlines()[-1]
    m = re.search(r"([\d.]+) ([GM])B/s", line)
    return line, (float(m.group(1)) * (1e9 if m.group(2) == "G" else 1e6)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=45)
    ap.add_argument("--steps-every1", type=int, default=12)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--every", default="10,1", help="save intervals to run, of 10 and 1")
    ap.add_argument("--modes", default="swap,copy,fresh,memory,sync", help="snapshot ways to run")
    ap.add_argument("--dir", default="/tmp/pentad-ckpt-bench")
    ap.add_argument("--pentad", default=str(ROOT / "build/pentad"))
    args = ap.parse_args()
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    line, bandwidth = disk_bandwidth(args.dir)
    print(f"disk (dd, 1 GiB, oflag=direct): {line}")
    print(f"cores: {os.cpu_count()} (2 compute threads; the saver's thread shares them)")
    modes = [m for m in ("swap", "copy", "fresh", "memory") if m in args.modes.split(",")] + ["sync"]
    intervals = [int(e) for e in args.every.split(",")]
    assert all(e in (10, 1) for e in intervals), "--every takes 10 and/or 1"
    configs = [(0, "none")] + [(e, m) for e in intervals for m in modes
                               if not (m == "memory" and e == 1)]  # files every step: no room
    results = {}
    for rep in range(args.reps):  # alternate the configurations, rep after rep
        for every, mode in configs:
            rows, saved, saver = run(args, every, mode)
            results.setdefault((every, mode), []).append((rows, saved))
            median = statistics.median(r["seconds"] for r in rows[WARMUP:])
            text = f"rep {rep} every {every or '-':>2} {mode:>4}: median step {median:.3f} s"
            if every:
                b = per_save(rows, every)
                warm = b[1:]
                text += (f", blocked first save {b[0]:.3f} s, warm saves ({len(warm)}) median "
                         f"{statistics.median(warm):.3f} s max {max(warm):.3f} s, "
                         f"checkpoint {saved / 2**30:.2f} GiB")
                if saver:
                    text += f", saver thread CPU per warm save {statistics.median(saver):.3f} s"
                if every > 3:  # the saver's cost inside the run: steps while it works or not
                    near = [r["seconds"] for r in rows[WARMUP:] if 0 < r["step"] % every <= 3]
                    far = [r["seconds"] for r in rows[WARMUP:] if r["step"] % every > 3]
                    text += (f"; median step in the 3 after a save {statistics.median(near):.3f} s, "
                             f"the others {statistics.median(far):.3f} s")
            print(text)

    def med(every, mode, f):
        return statistics.median(f(rows, saved) for rows, saved in results[(every, mode)])

    for every in intervals:
        steps = args.steps_every1 if every == 1 else args.steps
        base_rows = results[(0, "none")][0][0]
        for mode in (m for m in modes if (every, m) in results):
            # Throughput over the steps after the first save, against the same steps without.
            none_wall = statistics.median(window_wall([r for r in rows if r["step"] <= steps], every)
                                          for rows, _ in results[(0, "none")])
            thr = none_wall / med(every, mode, lambda rows, s: window_wall(rows, every))
            warm = med(every, mode, lambda rows, s: statistics.median(per_save(rows, every)[1:]))
            sync = med(every, "sync", lambda rows, s: statistics.median(per_save(rows, every)[1:]))
            print(f"every {every:>2} {mode:>4}: throughput {thr:.3f} of no checkpoints, warm save "
                  f"blocks {warm:.3f} s = {warm / sync:.1%} of the synchronous save")
        if every == 1 and bandwidth:
            state = results[(1, "swap")][0][1]  # keep_last = 1: one checkpoint's bytes
            step = statistics.median(r["seconds"] for r in base_rows[WARMUP:])
            print(f"disk bound every step: {state / 2**30:.2f} GiB per save / {bandwidth / 1e9:.2f} "
                  f"GB/s = {state / bandwidth:.3f} s against a step of {step:.3f} s: throughput "
                  f"<= {min(1.0, step / (state / bandwidth)):.2f}")


if __name__ == "__main__":
    main()
