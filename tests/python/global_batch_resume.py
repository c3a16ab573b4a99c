#!/usr/bin/env python3
"""The global batch and the data order across resumes under other layouts.

1. train.global_batch = 12 (micro_batch 1): a run on dp 4 saves at step 3, is resumed on
   dp 2 to step 6, then on dp 3 to step 9. Every step reads the same 12 samples as one
   rank training straight through (--dump-samples lists the indices each replica read),
   every sample 0..107 is read exactly once, and the losses follow one rank's.
2. Without it (grad_accum 3): dp 4 -> 2 halves the global batch, said in one line naming
   train.global_batch, and the data order still continues where the checkpoint left it
   (no sample read twice or skipped).
3. A global batch the layout cannot divide is refused in one line naming the keys.
4. --resume latest where there is no checkpoint warns that training starts from step 0;
   --resume takes a root of checkpoints like train.init_from (its newest), and
   train.init_from = "latest" is refused naming --resume.

usage: global_batch_resume.py PENTAD RECIPE WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1")
COMMON = ["train.steps=9", "train.eval_every=0", "train.threads=1", "data.source=random",
          "train.micro_batch=1", "train.seq_len=16", "model.max_seq_len=16",
          "optim.warmup_steps=2", "train.log_every=100"]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(pentad, recipe, ranks, out, overrides, extra=()):
    """(exit status, log) of one pentad train; the samples each step read go to out/samples."""
    launcher = ["mpirun", "--oversubscribe", "-np", str(ranks)] if ranks > 1 else []
    cmd = [*launcher, pentad, "train", recipe, "--dump-samples", str(out / "samples"), *extra]
    for o in COMMON + overrides + [f"train.out_dir={out}"]:
        cmd += ["--set", o]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def train(pentad, recipe, ranks, out, overrides, extra=()):
    rc, log = run(pentad, recipe, ranks, out, overrides, extra)
    if rc != 0:
        print(log[-4000:])
        raise SystemExit(f"pentad failed in {out}")
    return log


def samples(out):
    """{step: [sample indices read by every replica, sorted]} of one run."""
    steps = {}
    for f in sorted((out / "samples").glob("dp*.jsonl")):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            steps.setdefault(row["step"], []).extend(row["samples"])
    return {s: sorted(ids) for s, ids in steps.items()}


def losses(out):
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    return {int(r["step"]): r["loss"] for r in rows if "loss" in r}


def every_sample_once(read, total, what):
    ids = sorted(i for step in read.values() for i in step)
    check(ids == list(range(total)), f"{what}: samples 0..{total - 1} each read exactly once"
          + ("" if ids == list(range(total)) else f" (read: {ids})"))


def main():
    pentad, recipe, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    # 1. train.global_batch = 12 across dp 4 -> 2 -> 3.
    gb = ["train.global_batch=12"]
    straight = work / "straight"
    train(pentad, recipe, 1, straight, gb)
    ckpt = work / "gb-ckpt"
    save = [f"train.ckpt_dir={ckpt}", "train.save_every=3"]
    chain = []
    for ranks, stop in ((4, 3), (2, 6), (3, 9)):
        out = work / f"gb-dp{ranks}"
        extra = ["--resume", "latest"] if chain else []
        log = train(pentad, recipe, ranks, out, gb + save + [f"train.stop_at={stop}"], extra)
        if chain:
            check(f"at step {stop - 3}" in log, f"dp{ranks}: resumed at step {stop - 3}")
            check("the global batch is now" not in log, f"dp{ranks}: the global batch kept")
        chain.append(out)
    read = {}
    for out in chain:
        read.update(samples(out))
    want = samples(straight)
    check(want == {s: list(range(12 * (s - 1), 12 * s)) for s in range(1, 10)},
          "one rank: step t reads samples 12(t-1) .. 12t-1")
    check(read == want, "dp 4 -> 2 -> 3: every step reads one rank's samples"
          + ("" if read == want else f" (read {read})"))
    every_sample_once(read, 108, "dp 4 -> 2 -> 3")
    a = losses(straight)
    b = {}
    for out in chain:
        b.update(losses(out))
    close = sorted(a) == sorted(b) == list(range(1, 10)) and all(
        abs(a[s] - b[s]) <= 1e-4 * abs(a[s]) for s in a)
    check(close, "dp 4 -> 2 -> 3: the losses follow one rank's within 1e-4"
          + ("" if close else f" (one rank {a}, resharded {b})"))

    # 2. No train.global_batch: the batch follows the layout, said in one line; the data
    # order still continues at the checkpoint's sample.
    ckpt2 = work / "ga-ckpt"
    save2 = [f"train.ckpt_dir={ckpt2}", "train.save_every=3", "train.grad_accum=3"]
    first, second = work / "ga-dp4", work / "ga-dp2"
    train(pentad, recipe, 4, first, save2 + ["train.stop_at=3"])
    log = train(pentad, recipe, 2, second, save2 + ["train.stop_at=6"], ["--resume", "latest"])
    line = ("the global batch is now 6 sequences (micro_batch 1 x grad_accum 3 x dp 2); it "
            f"was 12 when {ckpt2}/step-00000003 was saved: set train.global_batch = 12 to "
            "keep it")
    check(line in log, "dp 4 -> 2 without train.global_batch: one line says the batch halved")
    read = {**samples(first), **samples(second)}
    check(all(len(read[s]) == (12 if s <= 3 else 6) for s in range(1, 7)),
          "dp 4 -> 2: 12 samples a step, then 6")
    every_sample_once(read, 3 * 12 + 3 * 6, "dp 4 -> 2 without train.global_batch")

    # 3. A layout that does not divide the global batch: refused, naming the keys.
    rc, log = run(pentad, recipe, 1, work / "refused", gb + ["train.micro_batch=5"])
    check(rc == 2 and "train.global_batch = 12 is not a multiple of train.micro_batch (5) x dp "
          "(1) = 5" in log, "global_batch 12 on micro_batch 5: refused naming the keys")

    # 4. --resume latest with nothing to resume; --resume and init_from take the same paths.
    empty = work / "empty-ckpt"
    log = train(pentad, recipe, 1, work / "fresh", [f"train.ckpt_dir={empty}",
                                                    "train.stop_at=1"], ["--resume", "latest"])
    check(f"--resume latest: no checkpoint found in {empty}: training starts from step 0" in log,
          "--resume latest with no checkpoint: a warning says training starts from step 0")
    log = train(pentad, recipe, 1, work / "from-root", gb, ["--resume", str(ckpt)])
    check(f"resumed from {ckpt}/step-00000009 at step 9" in log,
          "--resume ROOT: the root's newest checkpoint, like train.init_from")
    rc, log = run(pentad, recipe, 1, work / "init-latest", ["train.init_from=latest"])
    check(rc == 2 and "--resume latest" in log,
          "train.init_from = latest: refused, naming --resume latest")

    if failures:
        print("FAILED:", "; ".join(failures))
        sys.exit(1)
    print("every sample read exactly once across the reshards")


if __name__ == "__main__":
    main()
