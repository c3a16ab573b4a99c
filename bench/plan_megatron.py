#!/usr/bin/env python3
"""`pentad plan --cluster dgx-h100` against Megatron-Core's published H100 weak-scaling table
(GPT, sequence 4096, vocabulary 131072; Megatron-LM README, "Performance Benchmarking").
For each row: the planner's prediction for Megatron's own layout (--layout tp, pp, dp named,
micro-batch 1, sequence parallelism with tp, distributed optimizer = ZeRO-1, no recompute,
memory not limited: the layout as Megatron ran it; pentad's own memory plan for it is shown;
interleaved with 2 virtual stages where grad_accum
24 is a multiple of pp and the layers split into 2 pp chunks, else 1F1B), and pentad's own best plan on the same GPUs (everything
searched, memory within 80 GB).

MFU is reported twice: as pentad counts FLOPs (causal attention: each query meets s/2 keys)
and as Megatron counts them (72 B s L h^2 (1 + s/(6h) + V/(12 h L)) a step: full s x s
attention), which is what the published figures use; the comparison is on the latter.

usage: plan_megatron.py PENTAD [--rows 1.7b,7.1b,...] [--no-search]
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = [  # name, tp, pp, gpus, published MFU %
    ("1.7b", 1, 1, 48, 41), ("7.1b", 2, 1, 96, 47), ("16b", 4, 1, 192, 49),
    ("32b", 8, 1, 384, 46), ("70b", 8, 2, 768, 42), ("119b", 8, 4, 1536, 43),
    ("177b", 8, 6, 2304, 44), ("314b", 8, 8, 3072, 48), ("462b", 8, 16, 6144, 47),
]


def recipe_model(path):
    m = {}
    section = ""
    for line in open(path):
        line = line.split("#")[0].strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif "=" in line and section == "model":
            k, v = (x.strip() for x in line.split("=", 1))
            m[k] = v.strip('"')
    return int(m["n_layer"]), int(m["d_model"]), int(m["vocab_size"])


def plan(pentad, recipe, gpus, layout=None, memory_gb=None):
    cmd = [pentad, "plan", str(recipe), "--ranks", str(gpus), "--cluster", "dgx-h100", "--json"]
    if memory_gb:
        cmd += ["--memory-gb", str(memory_gb)]
    if layout:
        cmd += ["--layout", layout]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}:\n{p.stdout}{p.stderr}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pentad")
    ap.add_argument("--rows", default="")
    ap.add_argument("--no-search", action="store_true")
    a = ap.parse_args()
    want = set(a.rows.split(",")) if a.rows else None
    print("| model | GPUs | Megatron layout | published MFU | predicted MFU (Megatron's count) "
          "| pentad's count | error | schedule picked | pentad's memory plan | pentad's best plan (80 GB) "
          "| its MFU (Megatron's count) |")
    print("|---|---:|---|---:|---:|---:|---:|---|---:|---|---:|")
    worst = 0.0
    for name, tp, pp, gpus, published in ROWS:
        if want and name not in want:
            continue
        recipe = HERE / "plan" / "megatron" / f"gpt-{name}.toml"
        L, h, V = recipe_model(recipe)
        s = 4096
        dp = gpus // (tp * pp)
        # Megatron's interleaved schedule (2 virtual stages) where the micro-batches allow it.
        sched_fields = (f"schedule=interleaved,vp=2," if pp > 1 and 24 % pp == 0 and L % (2 * pp) == 0 else
                        f"schedule=1f1b,vp=1," if pp > 1 else "")
        layout = (sched_fields + f"tp={tp},tp_shape={tp}x1,pp={pp},dp={dp},cp=1,mb=1,sp={'true' if tp > 1 else 'false'},"
                  f"zero=1,recompute=false,offload=none,ep=1,etp=1")
        fixed = plan(a.pentad, recipe, gpus, layout, memory_gb=10000)
        row = fixed["rows"][0]
        peak = fixed["peak_flops_per_device"]
        tokens_per_s_dev = row["tokens_per_second"] / gpus
        megatron_per_token = 72 * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
        mfu_meg = tokens_per_s_dev * megatron_per_token / peak
        err = mfu_meg * 100 / published - 1
        worst = max(worst, abs(err))
        best_txt, best_mfu = "-", "-"
        if not a.no_search:
            best = plan(a.pentad, recipe, gpus)["rows"][0]
            best_txt = best["layout"]
            best_mfu = f"{100 * best['tokens_per_second'] / gpus * megatron_per_token / peak:.1f}%"
        sched = " ".join(w for w in row["layout"].split() if w in ("1f1b", "interleaved", "kfkb", "rc") or w[:1] in "vk" and w[1:].isdigit()) or "-"
        print(f"| {name.upper()} | {gpus} | TP{tp} PP{pp} DP{dp} | {published}% | {100 * mfu_meg:.1f}% "
              f"| {100 * row['mfu']:.1f}% | {100 * err:+.0f}% | {sched} | {row['memory_bytes'] / 1e9:.0f} GB "
              f"| {best_txt} | {best_mfu} |",
              flush=True)
    print(f"\nworst relative error against the published MFU: {100 * worst:.0f}%")
    return 0 if worst <= 0.15 else 1


if __name__ == "__main__":
    sys.exit(main())
