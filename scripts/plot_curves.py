#!/usr/bin/env python3
"""Training curves of pentad runs: `pentad plot RUN_DIR [RUN_DIR ...] -o curves.png` runs this.

Reads each run directory's metrics.jsonl (train.out_dir) and draws a 2x2 figure against the
step: the loss (training, and evaluation as dots), the learning rate, the throughput
(tokens/s) and the gradient norm (log scale, before clipping); one colour per run, named by its directory in the legend.
A resumed run that trained some steps again counts the later rows, as TensorBoard does.
Needs matplotlib (Debian: python3-matplotlib, which scripts/setup.sh installs).
"""
import argparse
import json
import math
import os
import sys
from pathlib import Path

def refuse(message):
    """The same status as pentad's refusals (2), the message on stderr."""
    print(f"pentad plot: {message}", file=sys.stderr)
    sys.exit(2)


PANELS = [("loss", "loss"), ("lr", "learning rate"), ("tokens_per_second", "tokens/s"),
          ("grad_norm", "gradient norm")]


def read_curves(run_dir: Path):
    """{key: {step: value}} for every per-step key of metrics.jsonl, plus eval_loss."""
    curves = {}
    for number, line in enumerate((run_dir / "metrics.jsonl").read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            refuse(f"{run_dir}/metrics.jsonl line {number} is not JSON ({e})")
        if "step" not in row:
            continue  # a checkpoint's timings or the run's totals
        step = row["step"]
        if "loss" in row:
            # A resumed run's first step below the last one seen: the steps it trains again
            # replace the earlier run's.
            seen = curves.get("loss", {})
            if seen and step <= max(seen):
                for points in curves.values():
                    for s in [s for s in points if s >= step]:
                        del points[s]
        for key, value in row.items():
            if key != "step" and (value is None or isinstance(value, (int, float))):
                curves.setdefault(key, {})[step] = math.nan if value is None else float(value)
    return curves


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories (train.out_dir)")
    parser.add_argument("-o", "--out", required=True, type=Path, help="PNG file to write")
    args = parser.parse_args()
    for d in args.run_dirs:
        if not (d / "metrics.jsonl").is_file():
            refuse(f"{d} has no metrics.jsonl: give the train.out_dir of a run "
                     "that has trained at least one step")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        refuse(f"{sys.executable} cannot import matplotlib ({e}): install it "
                 "(Debian: apt-get install python3-matplotlib; scripts/setup.sh does), or name a "
               "python that has it in PENTAD_PYTHON")

    names = [os.path.basename(os.path.normpath(d)) for d in args.run_dirs]
    if len(set(names)) < len(names):  # the same name twice: say which is which
        names = [str(d) for d in args.run_dirs]
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5), sharex=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (run_dir, name) in enumerate(zip(args.run_dirs, names)):
        curves = read_curves(run_dir)
        colour = colours[i % len(colours)]
        for ax, (key, _) in zip(axes.flat, PANELS):
            points = sorted(curves.get(key, {}).items())
            if points:
                ax.plot(*zip(*points), color=colour, linewidth=1.2,
                        label=f"{name} (train)" if key == "loss" else name)
        evals = sorted(curves.get("eval_loss", {}).items())
        if evals:
            axes[0, 0].plot(*zip(*evals), color=colour, linestyle="--", marker="o",
                            markersize=4, label=f"{name} (eval)")
    for ax, (_, label) in zip(axes.flat, PANELS):
        ax.set_title(label)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("step")
    axes[0, 0].legend(fontsize=8)
    axes[0, 1].ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    axes[1, 1].set_yscale("log")  # one clipped spike would flatten the rest
    fig.tight_layout()
    try:
        fig.savefig(args.out, dpi=100)
    except OSError as e:
        refuse(f"cannot write {args.out}: {e}")
    print(f"pentad plot: wrote {args.out} ({len(args.run_dirs)} run"
          f"{'s' if len(args.run_dirs) > 1 else ''})")


if __name__ == "__main__":
    main()
