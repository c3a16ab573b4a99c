#!/usr/bin/env python3
"""After a fault at GPU scale: the layout `pentad launch --replan` restarts on, against one
data-parallel replica fewer (`--exclude-culprit`), as the planner predicts them
(`pentad plan RECIPE --ranks N --cluster dgx-h100 --after-loss K --json`), for the Megatron-Core
rows' recipes and a Mixtral-style MoE, after losing one GPU (K = 1) and one node (K = 8).

usage: replan_gpu.py PENTAD [CASE ...]   (CASE: recipe:ranks, e.g. bench/plan/megatron/gpt-70b.toml:64)
Prints a Markdown table: the layout before, after one replica fewer (and its global batch when
it shrinks), re-planned, each one's tokens/s against before, and re-planned against one
replica fewer.
"""
import json
import subprocess
import sys
import time

PENTAD = sys.argv[1]
CASES = sys.argv[2:] or [
    "bench/plan/megatron/gpt-7.1b.toml:64",
    "bench/plan/megatron/gpt-70b.toml:64",
    "bench/plan/megatron/gpt-70b.toml:1024",
    "bench/plan/megatron/gpt-177b.toml:1024",
    "recipes/mixtral-8x7b.toml:64",
    "recipes/mixtral-8x7b.toml:256",
]

print("| recipe | ranks | lost | before | one replica fewer | x before | re-planned | x before "
      "| re-planned / fewer | plan s |")
print("|---|---:|---:|---|---|---:|---|---:|---:|---:|")
for case in CASES:
    recipe, ranks = case.rsplit(":", 1)
    for lost in (1, 8):
        t0 = time.monotonic()
        p = subprocess.run([PENTAD, "plan", recipe, "--ranks", ranks, "--cluster", "dgx-h100",
                            "--after-loss", str(lost), "--json"], capture_output=True, text=True)
        seconds = time.monotonic() - t0
        name = recipe.rsplit("/", 1)[-1].removesuffix(".toml")
        if p.returncode != 0:
            print(f"| {name} | {ranks} | {lost} | refused: {p.stderr.strip()[:200]} |||||||")
            continue
        j = json.loads(p.stdout)
        before, fewer, replanned = j["before"], j["one_replica_fewer"], j["replanned"]
        base = before["tokens_per_second"]
        if fewer:
            gb = j["one_replica_fewer_global_batch"]
            shrunk = "" if gb == j["global_batch"] else f" (batch {gb} of {j['global_batch']:.0f})"
            fewer_cell = f"{fewer['layout']} on {fewer['ranks']}{shrunk}"
            fewer_x = f"{fewer['tokens_per_second'] / base:.3f}"
            gain = f"{replanned['tokens_per_second'] / fewer['tokens_per_second']:.3f}"
        else:
            fewer_cell, fewer_x, gain = "refused: " + j.get("one_replica_fewer_refused", "")[:80], "-", "-"
        print(f"| {name} | {ranks} | {lost} | {before['layout']} | {fewer_cell} | {fewer_x} | "
              f"{replanned['layout']} on {replanned['ranks']} | "
              f"{replanned['tokens_per_second'] / base:.3f} | {gain} | {seconds:.0f} |", flush=True)
