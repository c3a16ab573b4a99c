#!/usr/bin/env python3
"""Context parallelism on CPU ranks: step time and per-rank activation memory against cp 1.

Trains a small LLaMA (2 layers, width 128, 8 heads, 4 kv heads, vocabulary 512, micro-batch
1, fp32, train.threads=1, random tokens) for a few steps at long sequences under cp 1, 2 and
4 and reports, per run:
  - the median step time after the first step (the step spans of --comm-log, rank 0);
  - rank 0's activation bytes from the memory plan it prints at start-up (the model's
    activation arenas plus the context-parallel buffers, measured from the real arenas),
    and the cp buffers alone;
  - every rank's peak resident memory (/usr/bin/time -v), the largest.
Ratios are against cp 1 at the same sequence length, measured in the same invocation.
Memory should fall close to 1/cp: every activation is per token, except the cp buffers
(the ring's K/V blocks are T/R tokens of kv heads, a few per layer-shared buffer).

usage: /usr/bin/python3 bench/cp_scaling.py [--pentad build/pentad] [--steps 4]
           [--runs "4096:1:ring,4096:2:ring,..."] [--work bench/out/cp_scaling]
Ranks run under mpirun --oversubscribe. On a 2-core machine cp 2 gives each rank a core
(a real, if memory-bandwidth-shared, speed-up measurement); cp 4 puts two ranks on each core,
so its step time measures the split's total work and overhead (ideal: cp 1's time / 2, the
two cores' worth), not a speed-up.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = {"model.n_layer": 2, "model.d_model": 128, "model.n_head": 8, "model.n_kv_head": 4,
         "model.vocab_size": 512, "train.micro_batch": 1, "train.grad_accum": 1,
         "train.eval_every": 0, "train.threads": 1, "data.source": "random"}
RUNS = ("4096:1:ring,4096:2:ring,4096:4:ring,4096:2:ulysses,4096:4:ulysses,"
        "16384:1:ring,16384:2:ring,16384:4:ring,16384:2:ulysses")
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def parse_bytes(text):
    value, unit = text.split()
    return float(value) * UNITS[unit]


def run(pentad, seq, cp, impl, steps, work):
    tag = f"T{seq}_cp{cp}_{impl}"
    log_dir = work / tag
    shutil.rmtree(log_dir, ignore_errors=True)
    keys = dict(MODEL)
    keys.update({"model.max_seq_len": seq, "train.seq_len": seq, "train.steps": steps,
                 "parallel.cp": cp, "parallel.cp_impl": impl, "train.out_dir": work / "out"})
    train = ([str(pentad), "train", str(ROOT / "recipes/llama-tiny.toml")] +
             [x for k, v in keys.items() for x in ("--set", f"{k}={v}")] +
             ["--comm-log", str(log_dir)])
    cmd = (["mpirun", "--oversubscribe", "-np", str(cp), "/usr/bin/time", "-v"] + train)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    text = p.stdout + p.stderr
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{text[-3000:]}")
    plan = next(line for line in text.splitlines() if "[rank 0] memory plan" in line)
    acts = parse_bytes(re.search(r"activations ([\d.]+ \w+)", plan).group(1))
    m = re.search(r"with ([\d.]+ \w+) of context-parallel buffers", plan)
    cp_bufs = parse_bytes(m.group(1)) if m else 0.0
    rss = max(int(x) * 1024 for x in
              re.findall(r"Maximum resident set size \(kbytes\): (\d+)", text))
    steps_log = json.loads((log_dir / "rank0.json").read_text())["steps"]
    step_s = statistics.median(s["seconds"] for s in steps_log[1:])
    return dict(seq=seq, cp=cp, impl=impl, step_s=step_s, acts=acts, cp_bufs=cp_bufs, rss=rss,
                cmd=" ".join(cmd))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pentad", default=str(ROOT / "build/pentad"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--runs", default=RUNS, help="comma-separated seq:cp:impl")
    ap.add_argument("--work", default=str(ROOT / "bench/out/cp_scaling"))
    args = ap.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    print(f"model: {' '.join(f'{k}={v}' for k, v in MODEL.items())}; {args.steps} steps, "
          "median step after the first")
    print("| T | cp | impl | step s | vs cp 1 | activations (rank 0) | x cp 1 | "
          "of which cp buffers | peak RSS (largest rank) | x cp 1 |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    base = {}
    for spec in args.runs.split(","):
        seq, cp, impl = spec.split(":")
        r = run(args.pentad, int(seq), int(cp), impl, args.steps, work)
        print(f"<!-- {r['cmd']} -->")
        if r["cp"] == 1:
            base[r["seq"]] = r
        b = base.get(r["seq"])

        def ratio(key, r=r, b=b):
            return f"{r[key] / b[key]:.3f}" if b else "-"
        mib = 1 << 20
        print(f"| {r['seq']} | {r['cp']} | {r['impl'] if r['cp'] > 1 else '-'} | "
              f"{r['step_s']:.3f} | {ratio('step_s')} | {r['acts'] / mib:.1f} MiB | "
              f"{ratio('acts')} | {r['cp_bufs'] / mib:.2f} MiB | {r['rss'] / mib:.0f} MiB | "
              f"{ratio('rss')} |", flush=True)


if __name__ == "__main__":
    main()
