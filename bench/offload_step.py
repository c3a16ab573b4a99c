#!/usr/bin/env python3
"""AdamW state offloaded to NVMe: step time against no offload, and how much I/O is hidden.

Trains GPT-2 124M's shape (recipes/gpt2-124m.toml: 124M values, m + v = 1 GB) on random
tokens, micro-batch 1 x 128 tokens, --steps steps, in two layouts:
  dp1        one rank, 2 threads;
  dp2-zero2  two ranks (parallel.zero = 2), 1 thread each: each rank streams its half.
each with parallel.offload = "none" and "nvme" (offload_path under --dir, the defaults for
block size, queue depth and sub-group), the two taking turns --reps times (A B A B).
A round also measures the disk under --dir with fio (sequential O_DIRECT io_uring write,
then read, requests of nvme_block_kb with nvme_queue_depth in flight, as the engine issues
them), so each round's disk rate is taken beside its runs.

Per run: the median step seconds after the first --skip steps (metrics.jsonl, rank 0) and,
with nvme, pentad's closing line: bytes read and written over the run and the seconds the
optimizer waited for reads (R) and writes (W), rank 0. The I/O's own time is what those
bytes take at the disk's measured rate, reads and writes one after the other (one disk;
with two ranks both stream to it at once, so each gets about half its rate). Two views of
how much of it is hidden:
  waits      1 - (R + W) / that time: what the engine's overlap hid from the optimizer;
  step time  1 - (fastest nvme step - fastest none step) / that time: what the step itself
             did not pay (the fastest steps: the least disturbed by a shared machine).
--wait-policy passive: OpenMP threads that wait sleep instead of spinning. On a machine
shared with other work, libgomp's spinning threads (the default) take turns with the
neighbour's and the step time swings by 3x; passive keeps them off the cores while the
main thread waits for the disk or for a descheduled thread.
parallel.offload = "cpu" is not measured: on a CPU run it is what "none" does already
(state and update on the host).

usage: /usr/bin/python3 bench/offload_step.py [--pentad build/pentad] [--steps 6] [--skip 2]
           [--reps 3] [--dir /tmp/pentad-offload-bench] [--layouts dp1,dp2-zero2]
           [--wait-policy passive] [--raw FILE.json] [--table FILE.json]
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
MiB = 1 << 20
COMMON = {"train.micro_batch": 1, "train.seq_len": 128, "train.grad_accum": 1,
          "train.eval_every": 0, "train.log_every": 1, "data.source": "random"}
LAYOUTS = {"dp1": (1, {"train.threads": 2}),
           "dp2-zero2": (2, {"train.threads": 1, "parallel.dp": 2, "parallel.zero": 2})}
BLOCK_KB, DEPTH = 1024, 32  # pentad's nvme_block_kb and nvme_queue_depth defaults


def fio_gbps(directory, rw, gib):
    out = subprocess.run(
        ["fio", f"--name=offload-{rw}", f"--filename={directory / 'fio.file'}", "--direct=1",
         "--ioengine=io_uring", f"--rw={rw}", f"--bs={BLOCK_KB}k", f"--iodepth={DEPTH}",
         f"--size={gib}g", "--numjobs=1", "--output-format=json"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)["jobs"][0][rw]["bw_bytes"] / 1e9


def run(pentad, layout, offload, steps, directory, wait_policy):
    ranks, keys = LAYOUTS[layout]
    out = directory / f"{layout}-{offload}"
    shutil.rmtree(out, ignore_errors=True)
    keys = dict(COMMON, **keys, **{"train.steps": steps, "train.out_dir": out,
                                   "parallel.offload": offload})
    if offload == "nvme":
        (directory / "state").mkdir(exist_ok=True)
        keys["parallel.offload_path"] = directory / "state"
    cmd = ([] if ranks == 1 else ["mpirun", "--oversubscribe", "-np", str(ranks)])
    cmd += [str(pentad), "train", str(ROOT / "recipes/gpt2-124m.toml")]
    cmd += [x for k, v in keys.items() for x in ("--set", f"{k}={v}")]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("PENTAD_POISON", None)
    if wait_policy:
        env["OMP_WAIT_POLICY"] = wait_policy
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    text = p.stdout + p.stderr
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{text[-3000:]}")
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    seconds = [r["seconds"] for r in rows if "seconds" in r]
    rss = re.search(r"peak resident memory per rank: (\d+) to (\d+) MiB", text)
    r = dict(seconds=seconds, rss=int(rss.group(2)), cmd=" ".join(cmd))
    io = re.search(r"NVMe offload \(rank 0\): ([\d.]+) GB read, ([\d.]+) GB written; the "
                   r"optimizer waited ([\d.]+) s for reads and ([\d.]+) s for writes", text)
    if io:
        r.update(read_gb=float(io.group(1)), written_gb=float(io.group(2)),
                 read_wait=float(io.group(3)), write_wait=float(io.group(4)))
    shutil.rmtree(out, ignore_errors=True)
    return r


def table(raw, steps, skip):
    """The summary of raw = {disk: {write, read}, runs: {"layout nvme|none": [run, ...]}}."""
    write_gbps = statistics.median(raw["disk"]["write"])
    read_gbps = statistics.median(raw["disk"]["read"])
    print(f"disk (fio, {BLOCK_KB} KiB x {DEPTH}, median of {len(raw['disk']['write'])}): write "
          f"{write_gbps:.2f} GB/s ({' '.join(f'{x:.2f}' for x in raw['disk']['write'])}), read "
          f"{read_gbps:.2f} GB/s ({' '.join(f'{x:.2f}' for x in raw['disk']['read'])})")
    print("| layout | s/step none | s/step nvme | nvme / none (per round) | fastest step none / "
          "nvme | peak RSS none / nvme MiB | I/O per step GB (r + w, rank 0) | at disk rate "
          "s/step | waited s/step (R + W) | hidden: waits | hidden: step time |")
    print("|---|---:|---:|---|---|---|---:|---:|---:|---:|---:|")
    for layout in dict.fromkeys(key.split()[0] for key in raw["runs"]):
        ranks = LAYOUTS[layout][0]
        none, nvme = raw["runs"][f"{layout} none"], raw["runs"][f"{layout} nvme"]
        med = [[statistics.median(r["seconds"][skip:]) for r in rs] for rs in (none, nvme)]
        fastest = [min(s for r in rs for s in r["seconds"][skip:]) for rs in (none, nvme)]
        ratios = [b / a for a, b in zip(*med)]
        per_step = [(r["read_gb"] / steps, r["written_gb"] / steps) for r in nvme]
        io_gb = statistics.median(a + b for a, b in per_step)
        # Both ranks stream to the one disk at once: each gets about 1 / ranks of its rate.
        io_s = statistics.median(a / (read_gbps / ranks) + b / (write_gbps / ranks)
                                 for a, b in per_step)
        waited = statistics.median((r["read_wait"] + r["write_wait"]) / steps for r in nvme)
        longer = fastest[1] - fastest[0]
        print(f"| {layout} | {statistics.median(med[0]):.3f} | {statistics.median(med[1]):.3f} | "
              f"{statistics.median(ratios):.3f} ({' '.join(f'{x:.2f}' for x in ratios)}) | "
              f"{fastest[0]:.2f} / {fastest[1]:.2f} = {fastest[1] / fastest[0]:.2f} | "
              f"{statistics.median(r['rss'] for r in none)} / "
              f"{statistics.median(r['rss'] for r in nvme)} | {io_gb:.2f} | {io_s:.3f} | "
              f"{waited:.3f} | {1 - waited / io_s:.0%} | {1 - longer / io_s:.0%} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pentad", default=str(ROOT / "build/pentad"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--skip", type=int, default=2, help="first steps left out of the median")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--fio-gib", type=int, default=1)
    ap.add_argument("--dir", default="/tmp/pentad-offload-bench")
    ap.add_argument("--layouts", default="dp1,dp2-zero2")
    ap.add_argument("--wait-policy", choices=["active", "passive"],
                    help="OMP_WAIT_POLICY for pentad (default: the environment's)")
    ap.add_argument("--raw", help="write every figure measured to this JSON file")
    ap.add_argument("--table", help="print the table of a --raw file, measuring nothing")
    args = ap.parse_args()
    if args.table:
        raw = json.loads(Path(args.table).read_text())
        return table(raw, raw["steps"], raw["skip"])
    directory = Path(args.dir)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    layouts = args.layouts.split(",")
    device = subprocess.run(["df", "--output=source", str(directory)], capture_output=True,
                            text=True).stdout.split()[-1]
    print(f"model: recipes/gpt2-124m.toml {' '.join(f'{k}={v}' for k, v in COMMON.items())}; "
          f"{args.steps} steps, median after the first {args.skip}; {args.reps} rounds; "
          f"{os.cpu_count()} cores; dir {directory} on {device}; OMP_WAIT_POLICY "
          f"{args.wait_policy or os.environ.get('OMP_WAIT_POLICY', 'unset')}")
    raw = {"steps": args.steps, "skip": args.skip, "disk": {"write": [], "read": []},
           "runs": {f"{layout} {offload}": [] for layout in layouts
                    for offload in ("none", "nvme")}}
    for rep in range(args.reps):
        for rw in ("write", "read"):
            raw["disk"][rw].append(fio_gbps(directory, rw, args.fio_gib))
        (directory / "fio.file").unlink()
        for layout in layouts:
            for offload in ("none", "nvme"):
                r = run(args.pentad, layout, offload, args.steps, directory, args.wait_policy)
                raw["runs"][f"{layout} {offload}"].append(r)
                step = statistics.median(r["seconds"][args.skip:])
                extra = ""
                if "read_gb" in r:
                    extra = (f"; {r['read_gb']:.2f} GB read, {r['written_gb']:.2f} GB written, "
                             f"waited {r['read_wait']:.3f} s + {r['write_wait']:.3f} s")
                print(f"round {rep + 1}: {layout} {offload}: steps "
                      f"{' '.join(f'{s:.2f}' for s in r['seconds'])} s (median {step:.3f}); "
                      f"peak RSS {r['rss']} MiB{extra}", flush=True)
        print(f"round {rep + 1}: fio write {raw['disk']['write'][-1]:.2f} GB/s, "
              f"read {raw['disk']['read'][-1]:.2f} GB/s", flush=True)
    for key, runs in raw["runs"].items():
        print(f"<!-- {runs[0]['cmd']} -->")
    if args.raw:
        Path(args.raw).write_text(json.dumps(raw, indent=1))
    table(raw, args.steps, args.skip)
    shutil.rmtree(directory, ignore_errors=True)

if __name__ == "__main__":
    main()
