#!/usr/bin/env python3
"""TensorBoard event files (<out_dir>/tensorboard) read back by TensorBoard's own reader.

1. A dense run (6 steps, eval every 3, checkpoints every 3) resumed from its step-3
   checkpoint (steps 4-6 trained again, into a second event file), and a 3-step MoE run:
   tensorboard's EventAccumulator, reading each directory as TensorBoard does, holds
   exactly the tags and steps of metrics.jsonl, every value equal in float32 (NaN for null).
   metrics.jsonl's rows map to scalars by this file's own reading of the rule in
   src/train/metrics_log.h, and a resumed run's rows replace those of the steps it trains
   again, as TensorBoard drops them at the resumed run's SessionLog START.
2. Every record's CRCs check out with tensorboard's crc32c (its summary_iterator reads
   every file, events in order, the first a file_version "brain.Event:2").
3. train.tensorboard = false writes no event file; a fresh run into an old out_dir deletes
   the old event files, as it starts metrics.jsonl anew.

usage: tensorboard_events.py PENTAD RECIPE WORKDIR
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

COMMON = ["data.source=random", "train.threads=1", "train.micro_batch=2", "train.seq_len=32",
          "train.log_every=100", "optim.warmup_steps=2"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def train(pentad, recipe, out, *overrides, resume=None):
    cmd = [pentad, "train", recipe, *COMMON, f"train.out_dir={out}", *overrides]
    if resume:
        cmd += ["--resume", resume]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        sys.exit(f"pentad train failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def flatten(tag, value, out):
    """The scalars of one JSON value under `tag` (src/train/metrics_log.h's rule)."""
    if isinstance(value, (bool, int, float)):
        out[tag] = float(value)
    elif value is None:
        out[tag] = math.nan
    elif isinstance(value, dict):
        for key, item in value.items():
            flatten(f"{tag}/{key}", item, out)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, dict) and isinstance(item.get("layer"), int):
                flatten(f"{tag}/{item['layer']}",
                        {k: v for k, v in item.items() if k != "layer"}, out)
            else:
                flatten(f"{tag}/{i}", item, out)


def expected_scalars(out):
    """{tag: [(step, float32 value)]} from metrics.jsonl."""
    expected, last_step = {}, 0
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        step_key = "step" if "step" in row else "saved_step" if "saved_step" in row else None
        step = row[step_key] if step_key else last_step
        if step_key == "step":
            if "loss" in row and step <= max((s for s, _ in expected.get("loss", [])),
                                             default=0):
                for tag in expected:  # a resumed run trains these steps again
                    expected[tag] = [(s, v) for s, v in expected[tag] if s < step]
            last_step = step
        scalars = {}
        for key, value in row.items():
            if key != step_key:
                flatten(key, value, scalars)
        for tag, value in scalars.items():
            expected.setdefault(tag, []).append((step, np.float32(value)))
    return expected


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def compare(out, name):
    acc = event_accumulator.EventAccumulator(str(out / "tensorboard"),
                                             size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    got = {tag: [(e.step, np.float32(e.value)) for e in acc.Scalars(tag)]
           for tag in acc.Tags()["scalars"]}
    want = expected_scalars(out)
    check(set(got) == set(want),
          f"{name}: the event files hold metrics.jsonl's {len(want)} tags"
          + ("" if set(got) == set(want) else
             f" (only in events: {sorted(set(got) - set(want))}, "
             f"only in metrics.jsonl: {sorted(set(want) - set(got))})"))
    bad = [tag for tag in set(got) & set(want)
           if [s for s, _ in got[tag]] != [s for s, _ in want[tag]]
           or not all(same(a, b) for (_, a), (_, b) in zip(got[tag], want[tag]))]
    check(not bad, f"{name}: every tag at the same steps with the same float32 values"
          + (f" (differ: {sorted(bad)[:5]}: {[(got[t], want[t]) for t in sorted(bad)[:1]]})"
             if bad else ""))
    return got


def check_records(path):
    """Each record's framing and CRCs, by hand with tensorboard's masked_crc32c."""
    data, at, records = path.read_bytes(), 0, 0
    while at < len(data):
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        payload = data[at + 12:at + 12 + length]
        (payload_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if header_crc != masked_crc32c(header) or payload_crc != masked_crc32c(payload):
            return -1
        at += 16 + length
        records += 1
    return records


def main():
    pentad, recipe, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    # 1. Dense, then resumed from step 3: steps 4-6 again, in a second event file.
    dense = work / "dense"
    train(pentad, recipe, dense, "train.steps=6", "train.eval_every=3", "train.save_every=3")
    # Its step 6 is newer than the step resumed: moved aside (retired/), as a resume of an
    # older checkpoint beside newer ones is otherwise refused.
    train(pentad, recipe, dense, "train.steps=6", "train.eval_every=3", "train.save_every=3",
          "train.retire_newer=true", resume=str(dense / "checkpoints" / "step-00000003"))
    files = sorted((dense / "tensorboard").iterdir())
    check(len(files) == 2 and all(f.name.startswith("events.out.tfevents.") for f in files),
          f"the resumed run added an event file ({[f.name for f in files]})")
    got = compare(dense, "dense + resumed")
    check({"loss", "eval_loss", "lr", "grad_norm", "tokens_per_second",
           "checkpoint_saves"} <= set(got), "loss, eval_loss, lr, grad_norm, tokens/s and "
          "checkpoint totals are among them")
    check([s for s, _ in got.get("loss", [])] == [1, 2, 3, 4, 5, 6]
          and [s for s, _ in got.get("eval_loss", [])] == [3, 6],
          "loss at steps 1-6 once each, eval loss at 3 and 6")

    # 2. The framing, record by record, and the reader's own pass over every file.
    for f in files:
        records = check_records(f)
        events = list(EventFileLoader(str(f)).Load())
        check(records == len(events) > 1 and events[0].file_version == "brain.Event:2",
              f"{f.name}: {records} records, CRCs valid, file_version first")

    moe = work / "moe"
    train(pentad, recipe, moe, "train.steps=3", "train.eval_every=0", "model.moe_layers=every:2",
          "model.n_experts=4", "model.top_k=2", "model.d_ff_expert=64",
          "moe.z_loss_coef=0.001")
    got = compare(moe, "MoE")
    check(any(t.startswith("moe_layers/") for t in got) and "moe_z_loss" in got,
          "MoE: the per-layer load and the router losses are among them")

    # 3. Off, and a fresh run over an old out_dir.
    off = work / "off"
    train(pentad, recipe, off, "train.steps=2", "train.tensorboard=false")
    check((off / "metrics.jsonl").is_file() and not (off / "tensorboard").exists(),
          "train.tensorboard = false: metrics.jsonl only")
    train(pentad, recipe, dense, "train.steps=2", "train.eval_every=0")
    check(len(list((dense / "tensorboard").iterdir())) == 1,
          "a fresh run into an old out_dir leaves only its own event file")
    compare(dense, "fresh over old")

    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("tensorboard events match metrics.jsonl")


if __name__ == "__main__":
    main()
