#!/usr/bin/env python3
"""The zero-bubble schedules on Megatron-Core's published H100 rows that pipeline (pp > 1),
predicted by `pentad plan` (its cost model and the schedule simulator): each row's own layout
(tp, pp, dp as published, micro-batch 1, sequence parallelism, ZeRO-1, no recompute, memory
not limited; as Megatron-Core runs it) under 1F1B, interleaved (v = 2), zb-h1 and zb-v, and
each schedule's predicted step and MFU, with the zero-bubble ones as a speed-up over 1F1B.
The rows and MFU count are bench/plan_megatron.py's.

usage: zero_bubble_plan.py PENTAD [--rows 70b,119b,...]
"""
import argparse
import sys

from plan_megatron import HERE, ROWS, Refused, plan, recipe_values

SCHEDULES = [("1f1b", "schedule=1f1b,vp=1,"), ("interleaved", "schedule=interleaved,vp=2,"),
             ("zb-h1", "schedule=zb-h1,vp=1,"), ("zb-v", "schedule=zb-v,vp=2,")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pentad")
    ap.add_argument("--rows", default="")
    a = ap.parse_args()
    want = set(a.rows.split(",")) if a.rows else None
    print("| model | GPUs | layout | micro-batches | " +
          " | ".join(f"{n} step s (MFU)" for n, _ in SCHEDULES) + " | zb-h1 / zb-v over 1F1B |")
    print("|---|---:|---|---:|" + "---:|" * (len(SCHEDULES) + 1))
    for name, tp, pp, gpus, _, (cluster, s) in ROWS:
        if pp == 1 or (want and name not in want):
            continue
        recipe = HERE / "plan" / "megatron" / f"gpt-{name}.toml"
        L, h, V, ga = recipe_values(recipe)
        dp = gpus // (tp * pp)
        per_token = 72 * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
        cells, steps = [], {}
        for sched, keys in SCHEDULES:
            layout = (f"{keys}tp={tp},tp_shape={tp}x1,pp={pp},dp={dp},cp=1,mb=1,"
                      f"sp={'true' if tp > 1 else 'false'},zero=1,recompute=false,offload=none,"
                      "ep=1,etp=1")
            try:
                result = plan(a.pentad, recipe, gpus, layout, memory_gb=10000,
                              engine="megatron-core", cluster=cluster)
            except Refused as e:
                cells.append("refused: " + str(e).strip().splitlines()[-1][:60])
                continue
            row = result["rows"][0]
            mfu = row["tokens_per_second"] / gpus * per_token / result["peak_flops_per_device"]
            steps[sched] = row["step_seconds"]
            cells.append(f"{row['step_seconds']:.2f} ({100 * mfu:.1f}%)")
        gain = " / ".join(f"{steps['1f1b'] / steps[z] - 1:+.1%}" if z in steps and "1f1b" in steps
                          else "-" for z in ("zb-h1", "zb-v"))
        print(f"| {name.upper()} | {gpus} | TP{tp} PP{pp} DP{dp} | {ga} | " + " | ".join(cells) +
              f" | {gain} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
