#!/usr/bin/env python3
"""`pentad plan --cluster dgx-h100` against Megatron-Core's published H100 weak-scaling table
(Megatron-LM README, "Performance Benchmarking", images/model_table.png: GPT, sequence 4096,
vocabulary 131072; heads, hidden size, layers, TP, PP, DP and global batch per row).

For each row, the planner predicts Megatron's own layout (--layout: tp, pp, dp as published,
micro-batch 1, sequence parallelism with tp, distributed optimizer = ZeRO-1, no recompute,
memory not limited) twice:
  - `--engine megatron-core`: as Megatron-Core runs it (the overlaps its README names:
    bf16 parameter gather behind the first forward, tp communication pipelined with GEMMs;
    plan/cost_model.h). This is the comparison with the published MFU.
  - `--engine pentad`: as pentad runs the same layout today (fp32 gather after the
    optimizer, 1D tp collectives waited for).
The README names no pipeline schedule; Megatron's default (no virtual stages) is 1F1B, and
that is the error's row; where 2 virtual stages divide the layers and the micro-batches,
the interleaved schedule's prediction is shown beside it.
Then (unless --no-search) pentad's own best plan on the same GPUs: everything searched,
memory within 80 GB, as pentad runs it.

MFU is counted as Megatron counts it: 72 B s L h^2 (1 + s/(6h) + V/(12 h L)) a step, full
s x s attention, against 989 TFLOP/s dense bf16.

Last, the two largest rows of the SC21 paper's A100 table (Narayanan et al., "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", Table 1: 530B and 1T,
heads 160 wide, sequence 2048, vocabulary 51200, bench/plan/megatron/gpt-530b.toml and
gpt-1t.toml), predicted the same way on `--cluster dgx-a100` (312 TFLOP/s).

usage: plan_megatron.py PENTAD [--rows 1.7b,7.1b,...] [--no-search]
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
H100 = ("dgx-h100", 4096)  # cluster preset, sequence length
A100 = ("dgx-a100", 2048)
ROWS = [  # name, tp, pp, gpus, published MFU %, (cluster, sequence)
    ("1.7b", 1, 1, 48, 41, H100), ("7.1b", 2, 1, 96, 47, H100), ("16b", 4, 1, 192, 49, H100),
    ("32b", 8, 1, 384, 46, H100), ("70b", 8, 2, 768, 42, H100), ("119b", 8, 4, 1536, 43, H100),
    ("177b", 8, 6, 2304, 44, H100), ("314b", 8, 8, 3072, 48, H100),
    ("462b", 8, 16, 6144, 47, H100),
    # The SC21 paper's A100 table (Narayanan et al., Table 1; sequence 2048, vocabulary 51200):
    # its two largest rows, whose heads are 160 wide. Shown last, with their cluster.
    ("530b", 8, 35, 2520, 52, A100), ("1t", 8, 64, 3072, 52, A100),
]


def recipe_values(path):
    v = {}
    for line in open(path):
        k, eq, val = line.split("#")[0].partition("=")
        if eq:
            v[k.strip()] = val.strip().strip('"')
    return int(v["n_layer"]), int(v["d_model"]), int(v["vocab_size"]), int(v["grad_accum"])


class Refused(Exception):
    """`pentad plan` refused (its message)."""


def plan(pentad, recipe, gpus, layout=None, memory_gb=None, engine="pentad", cluster="dgx-h100"):
    cmd = [pentad, "plan", str(recipe), "--ranks", str(gpus), "--cluster", cluster, "--json",
           "--engine", engine]
    if memory_gb:
        cmd += ["--memory-gb", str(memory_gb)]
    if layout:
        cmd += ["--layout", layout]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise Refused(f"{' '.join(cmd)}:\n{p.stdout}{p.stderr}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pentad")
    ap.add_argument("--rows", default="")
    ap.add_argument("--no-search", action="store_true")
    a = ap.parse_args()
    want = set(a.rows.split(",")) if a.rows else None
    print("| model | GPUs | layout | batch | published MFU | predicted, as Megatron-Core runs it "
          "| error | interleaved v2 | as pentad runs it | pentad's memory plan "
          "| pentad's best plan (80 GB) | its MFU |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    worst = 0.0
    for name, tp, pp, gpus, published, (cluster, s) in ROWS:
        if want and name not in want:
            continue
        recipe = HERE / "plan" / "megatron" / f"gpt-{name}.toml"
        L, h, V, ga = recipe_values(recipe)
        label = name.upper() + (" (A100)" if cluster == "dgx-a100" else "")
        dp = gpus // (tp * pp)
        per_token = 72 * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))

        def mfu(result, row):  # Megatron's count
            return row["tokens_per_second"] / gpus * per_token / result["peak_flops_per_device"]

        def predict(schedule, engine):
            layout = (f"{schedule}tp={tp},tp_shape={tp}x1,pp={pp},dp={dp},cp=1,mb=1,"
                      f"sp={'true' if tp > 1 else 'false'},zero=1,recompute=false,offload=none,"
                      "ep=1,etp=1")
            result = plan(a.pentad, recipe, gpus, layout, memory_gb=10000, engine=engine,
                          cluster=cluster)
            return result["rows"][0], mfu(result, result["rows"][0])

        default = "schedule=1f1b,vp=1," if pp > 1 else ""
        try:
            row, theirs = predict(default, "megatron-core")
        except Refused as e:  # 1T's pp 64: pentad's pipelines take at most 63 stages
            why = str(e).strip().splitlines()[-1].removeprefix("pentad: error: ")
            print(f"| {label} | {gpus} | TP{tp} PP{pp} DP{dp} | {ga * dp} | {published}% "
                  f"| refused: {why} | - | - | - | - | - | - |", flush=True)
            continue
        _, ours = predict(default, "pentad")
        interleaved = "-"
        if pp > 1 and ga % pp == 0 and L % (2 * pp) == 0:
            interleaved = f"{100 * predict('schedule=interleaved,vp=2,', 'megatron-core')[1]:.1f}%"
        err = theirs * 100 / published - 1
        worst = max(worst, abs(err))
        best_txt, best_mfu = "-", "-"
        if not a.no_search:
            result = plan(a.pentad, recipe, gpus, cluster=cluster)  # pentad's, within 80 GB
            best_txt = result["rows"][0]["layout"]
            best_mfu = f"{100 * mfu(result, result['rows'][0]):.1f}%"
        print(f"| {label} | {gpus} | TP{tp} PP{pp} DP{dp} | {ga * dp} | {published}% "
              f"| {100 * theirs:.1f}% | {100 * err:+.0f}% | {interleaved} | {100 * ours:.1f}% "
              f"| {row['memory_bytes'] / 1e9:.0f} GB | {best_txt} | {best_mfu} |", flush=True)
    print(f"\nworst relative error against the published MFU: {100 * worst:.0f}%")
    return 0 if worst <= 0.15 else 1


if __name__ == "__main__":
    sys.exit(main())
