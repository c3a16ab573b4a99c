#!/usr/bin/env python3
"""`pentad plot`: two tiny runs drawn into one PNG, and the refusals.

1. Two 4-step runs (eval on) at different learning rates: `pentad plot A B -o curves.png`
   exits 0 and writes a PNG (matplotlib reads it back: 1000 x 650 pixels) in which both
   runs' colours (matplotlib's first two, C0 and C1) are drawn.
2. Refusals, exit status 2 with a message naming the fix: a directory without
   metrics.jsonl (named), a path that is no directory, and a python3 without matplotlib
   (a stand-in matplotlib that fails to import, first on PYTHONPATH). No PNG is left.

usage: plot_curves.py PENTAD RECIPE WORKDIR
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np

ENV = dict(os.environ, OMP_NUM_THREADS="1")
COMMON = ["data.source=random", "train.threads=1", "train.micro_batch=2", "train.seq_len=32",
          "train.log_every=100", "train.steps=4", "train.eval_every=2", "optim.warmup_steps=1"]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(cmd, env=ENV):
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def colour_drawn(image, hex_colour):
    """Whether some pixels of the RGB(A) image are this colour (within rounding)."""
    rgb = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]) / 255.0
    return int((np.abs(image[..., :3] - rgb).max(axis=-1) < 0.02).sum())


def main():
    pentad, recipe, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for name, lr in (("lr-3e-3", "3e-3"), ("lr-1e-2", "1e-2")):
        proc = run([pentad, "train", recipe, *COMMON, f"optim.lr={lr}",
                    f"train.out_dir={work / name}"])
        if proc.returncode != 0:
            sys.exit(f"pentad train failed:\n{proc.stderr[-3000:]}")

    png = work / "curves.png"
    proc = run([pentad, "plot", str(work / "lr-3e-3"), str(work / "lr-1e-2"), "-o", str(png)])
    check(proc.returncode == 0 and png.is_file(), f"two runs plotted, exit {proc.returncode} "
          f"{proc.stderr.strip()[-300:]}")
    if png.is_file():
        image = matplotlib.image.imread(str(png))
        check(png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.shape[:2] == (650, 1000),
              f"a PNG of 1000 x 650 pixels ({image.shape[1]} x {image.shape[0]}, "
              f"{png.stat().st_size} bytes)")
        blue, orange = colour_drawn(image, "#1f77b4"), colour_drawn(image, "#ff7f0e")
        check(blue > 500 and orange > 500,
              f"both runs drawn: {blue} pixels in the first run's colour, {orange} in the second's")

    refused = work / "refused.png"
    empty = work / "empty"
    empty.mkdir()
    cases = [("a run directory without metrics.jsonl",
              [str(work / "lr-3e-3"), str(empty)], ENV, [str(empty), "metrics.jsonl"]),
             ("a path that is no directory", [str(work / "missing")], ENV,
              [str(work / "missing"), "not a directory"])]
    fake = work / "no-matplotlib"
    (fake / "matplotlib").mkdir(parents=True)
    (fake / "matplotlib" / "__init__.py").write_text(
        "raise ImportError('No module named matplotlib')\n")
    cases.append(("python3 without matplotlib", [str(work / "lr-3e-3")],
                  dict(ENV, PYTHONPATH=str(fake)), ["matplotlib", "python3-matplotlib"]))
    for what, dirs, env, words in cases:
        proc = run([pentad, "plot", *dirs, "-o", str(refused)], env=env)
        missing = [w for w in words if w not in proc.stderr]
        check(proc.returncode == 2 and not missing and not refused.exists(),
              f"refused: {what} (exit {proc.returncode}"
              + (f", message lacks {missing}: {proc.stderr.strip()[-300:]!r}" if missing else "")
              + ")")

    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("pentad plot draws and refuses as it should")


if __name__ == "__main__":
    main()
