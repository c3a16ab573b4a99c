#!/usr/bin/env python3
"""Checkpoints: bitwise resume, resharding on load, corruption fallback, crash safety.

1. 20 steps straight against 10 steps + save, then --resume latest for 10 more: every
   loss and every final weight bitwise identical, on one rank and on dp2 x tp2 (+SP).
2. Reshard: the dp2 x tp2 checkpoint of step 10 resumed under tp4, one rank, dp4 and
   pp2 x tp2 (same global batch) continues like one rank resumed from it, within 1e-5
   relative; likewise a pp2 x dp2 checkpoint (itself resumed bitwise) under tp2 and zb-h1,
   and a pp2 x dp2 zb-v ZeRO-2 checkpoint (itself resumed bitwise) under one rank and 1F1B.
3. A flipped byte in the newest checkpoint: resume names the file and the tensor and falls
   back to the previous checkpoint. With the local level lost, resume uses the mirror.
4. SIGKILL of a rank at random moments of a run saving every step, 4 trials (10 with
   PENTAD_FULL_TESTS=1, scripts/test.sh --full): the latest committed checkpoint always
   loads and training resumes.
5. Refusals that keep checkpoints safe: a resume with another model (n_layer, d_model,
   family, rope_theta, norm_eps, max_seq_len) or with every checkpoint corrupt, and a fresh
   run saving into a directory of checkpoints, exit non-zero naming the key or directory
   and leave every checkpoint file byte-identical; a checkpoint without its manifest is
   named in a warning.
6. A full disk (a tmpfs, where this runs as root): one line with the path, "No space
   left" and the bytes; the other level still commits; no .partial left behind; training
   stops after train.max_failed_saves failures in a row.
7. train.init_from: a checkpoint's weights under another layout, bitwise, at step 0 with a
   fresh optimizer; another model refused.

usage: checkpoint_resume.py PENTAD RECIPE WORKDIR [section.key=value ...]
"""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from shards import load_weights

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1")
COMMON = ["train.steps=20", "train.eval_every=0", "train.threads=1", "data.source=random",
          "train.micro_batch=2", "train.seq_len=32", "train.log_every=100"]
failures = []


def pentad_cmd(pentad, recipe, ranks, out, overrides, extra=()):
    # One rank runs as an MPI singleton: the same program, without mpirun's 2 s at every
    # non-zero exit (the refusals below).
    launcher = ["mpirun", "--oversubscribe", "-np", str(ranks)] if ranks > 1 else []
    cmd = [*launcher, pentad, "train", recipe, "--dump-weights", str(out / "weights"), *extra]
    for o in COMMON + overrides + [f"train.out_dir={out}"]:
        cmd += ["--set", o]
    return cmd


def train(pentad, recipe, ranks, out, overrides, extra=(), check=True, env=None):
    proc = subprocess.run(pentad_cmd(pentad, recipe, ranks, out, overrides, extra),
                          env=dict(ENV, **(env or {})), capture_output=True, text=True)
    if check and proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        raise SystemExit(f"pentad failed in {out}")
    return proc.stdout + proc.stderr


def losses(out):
    # The text of each loss as pentad wrote it: equal text means equal float bits.
    rows = [json.loads(l, parse_float=str) for l in (out / "metrics.jsonl").read_text().splitlines()]
    return {int(r["step"]): r["loss"] for r in rows if "loss" in r}


def run_pentad(pentad, recipe, ranks, out, overrides, extra=()):
    """(exit status, log) of a run that may be refused."""
    proc = subprocess.run(pentad_cmd(pentad, recipe, ranks, out, overrides, extra), env=ENV,
                          capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def weights(out):
    return load_weights(out / "weights")


def finish(success):
    """Exits non-zero listing the failed checks, or prints the line ctest waits for."""
    if failures:
        print("FAILED:", "; ".join(failures))
        sys.exit(1)
    print(success)


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def bitwise_resume(pentad, recipe, work, name, ranks, layout):
    straight, first, second = work / f"{name}-straight", work / f"{name}-first", work / f"{name}-resumed"
    ckpt = work / f"{name}-ckpt"
    train(pentad, recipe, ranks, straight, layout)
    train(pentad, recipe, ranks, first, layout + ["train.stop_at=10", "train.save_every=10",
                                                  f"train.ckpt_dir={ckpt}"])
    log = train(pentad, recipe, ranks, second, layout + [f"train.ckpt_dir={ckpt}"], ["--resume", "latest"])
    check("resumed from" in log and "at step 10" in log, f"{name}: resumed at step 10")
    a, b = losses(straight), {**losses(first), **losses(second)}
    check(sorted(a) == list(range(1, 21)) and a == b, f"{name}: 20 losses bitwise equal across the resume")
    wa, wb = weights(straight), weights(second)
    same = all(np.array_equal(wa[k].view(np.uint32), wb[k].view(np.uint32)) for k in wa)
    check(same and wa.keys() == wb.keys(), f"{name}: final weights bitwise equal")
    return ckpt


def swap_equals_copy(pentad, recipe, work):
    """checkpoint.snapshot = "swap" (the optimizer step after a save writes a second set of
    the state; the saver writes the first from where it lies) and "copy" (the lazy staging
    copy) write bitwise the same files at every save, and the run's losses do not depend on
    which, on dp2 x tp2 with a save every 3 steps (sets swapping back and forth). The saver's
    thread starts 300 ms late (PENTAD_SAVER_DELAY_MS), several steps of this tiny model, so
    an optimizer that wrote the saved set (or a copy it did not wait for) would change the
    file. A run resumed from the swap run's step-6 checkpoint ends where it did."""
    layout = ["parallel.tp=2", "parallel.sequence_parallel=true", "train.steps=12",
              "train.save_every=3", "train.keep_last=10"]
    runs = {}
    for mode in ("swap", "copy"):
        out = work / f"snapshot-{mode}"
        log = train(pentad, recipe, 4, out, layout + [f"checkpoint.snapshot={mode}",
                                                      f"train.ckpt_dir={out}/ckpt"],
                    env={"PENTAD_SAVER_DELAY_MS": "300"})
        check(f"({mode}:" in log, f"{mode}: the memory plan names the snapshot kind")
        runs[mode] = out
    steps = sorted(d.name for d in (runs["swap"] / "ckpt").glob("step-*"))
    check(steps == [f"step-{s:08d}" for s in (3, 6, 9, 12)], f"swap run committed 4 checkpoints: {steps}")
    for step in steps:
        for f in sorted((runs["swap"] / "ckpt" / step).glob("rank-*.h5")):
            other = runs["copy"] / "ckpt" / step / f.name
            check(other.exists() and f.read_bytes() == other.read_bytes(),
                  f"{step}/{f.name}: swap and copy snapshots bitwise equal")
    check(losses(runs["swap"]) == losses(runs["copy"]), "swap and copy runs: losses bitwise equal")
    # Each committed save logs its saver thread's time (the bench's CPU per save).
    for mode, out in runs.items():
        rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
        timed = [r for r in rows if "saved_step" in r]
        check([r["saved_step"] for r in timed] == [3, 6, 9, 12] and
              all(r["saver_write_seconds"] > 0 and r["saver_write_cpu_seconds"] >= 0 and
                  r["saver_copy_cpu_seconds"] >= 0 for r in timed),
              f"{mode}: the saver's seconds logged once per save: {timed}")
    resumed = work / "snapshot-resumed"
    train(pentad, recipe, 4, resumed, layout + ["train.save_every=0"],
          ["--resume", str(runs["swap"] / "ckpt" / "step-00000006")])
    a, b = losses(runs["swap"]), losses(resumed)
    check(all(a[s] == b[s] for s in range(7, 13)), "resumed from the swap run's step 6: losses bitwise")


def recycled_files(pentad, recipe, work):
    """checkpoint.recycle_files (the default): the rank files of each checkpoint that
    train.keep_last retires are written over by the next save instead of being deleted. The
    files and losses are bitwise those of a run that deletes them, the log counts the
    reuses, and the pool folder is gone at the end."""
    layout = ["train.steps=8", "train.save_every=1", "train.keep_last=1"]
    runs = {}
    for recycle in ("true", "false"):
        out = work / f"recycle-{recycle}"
        log = train(pentad, recipe, 2, out, layout + [f"checkpoint.recycle_files={recycle}",
                                                      f"train.ckpt_dir={out}/ckpt"])
        reused = re.search(r"(\d+) files written over recycled ones", log)
        check(reused is not None, f"recycle_files={recycle}: the checkpoint summary counts reuses")
        if recycle == "true":  # rank 0 writes every file here: the third save on reuses
            check(reused.group(1) == "6", f"recycled files reused: {reused.group(1)} of 8 (6)")
        else:
            check(reused.group(1) == "0", "recycle_files=false reuses nothing")
        check(not (out / "ckpt" / "recycled").exists(), f"recycle_files={recycle}: no pool left")
        runs[recycle] = out
    steps = sorted(d.name for d in (runs["true"] / "ckpt").glob("step-*"))
    check(steps == ["step-00000008"], f"keep_last=1 kept the last checkpoint only: {steps}")
    rank_files = {r: {k: v for k, v in files(runs[r] / "ckpt").items() if k.endswith(".h5")}
                  for r in runs}
    check(len(rank_files["true"]) == 1 and rank_files["true"] == rank_files["false"],
          "recycled and fresh rank files bitwise equal")
    check(losses(runs["true"]) == losses(runs["false"]), "losses do not depend on recycling")


def reshard(pentad, recipe, work, ckpt, source, runs):
    saved = ckpt / "step-00000010"
    ref = None
    for name, (ranks, layout) in runs.items():
        out = work / f"reshard-{source}-{name.replace(' ', '-')}"
        log = train(pentad, recipe, ranks, out, layout + [f"train.ckpt_dir={work / 'unused'}"],
                    ["--resume", str(saved)])
        check("at step 10" in log, f"reshard {source} -> {name}: resumed at step 10")
        got = np.array([float(v) for _, v in sorted(losses(out).items())])
        if ref is None:
            ref = got
            check(len(got) == 10, "one rank continued for 10 steps")
            continue
        err = np.max(np.abs(got - ref) / np.abs(ref)) if len(got) == len(ref) else np.inf
        check(err <= 1e-5, f"reshard {source} -> {name}: losses within 1e-5 of one rank ({err:.1e})")


def zero_checkpoints(pentad, recipe, work):
    """ZeRO: each dp rank saves the AdamW moments of its shares (rows of each parameter,
    named by their global identity), and at stage 3 the parameters' too. Resume is bitwise
    on the same layout (stage 3 and stage 2 with copy snapshots; stage 1 with swap snapshots,
    whose spare sets hold the shares), and a dp4 zero-3 checkpoint continues on one rank, on
    zero-1 dp2, and on dp2 x tp2 with and without ZeRO like one rank does."""
    ckpt = bitwise_resume(pentad, recipe, work, "dp4-zero3", 4,
                          ["parallel.tp=1", "parallel.zero=3", "train.grad_accum=1"])
    bitwise_resume(pentad, recipe, work, "dp2-zero2", 2,
                   ["parallel.tp=1", "parallel.zero=2", "train.grad_accum=2"])
    bitwise_resume(pentad, recipe, work, "dp2xtp2-zero1-swap", 4,
                   ["parallel.tp=2", "parallel.zero=1", "checkpoint.snapshot=swap",
                    "train.grad_accum=2"])
    manifest = json.loads((ckpt / "step-00000010" / "manifest.json").read_text())
    for kind in ("adam_m/", "param/"):
        shares = [s for s in manifest["shards"] if s["name"].startswith(kind)]
        check(len({s["file"] for s in shares}) == 4 and
              any(s.get("row_start", 0) > 0 for s in shares),
              f"zero-3 dp4: every rank saved the {kind[:-1]} of its own shares, named by rows")
    reshard(pentad, recipe, work, ckpt, "dp4-zero3", {
        "one rank": (1, ["train.grad_accum=4"]),
        "dp2-zero1": (2, ["parallel.tp=1", "parallel.zero=1", "train.grad_accum=2"]),
        "dp2xtp2": (4, ["parallel.tp=2", "train.grad_accum=2"]),
        "dp2xtp2-zero1": (4, ["parallel.tp=2", "parallel.zero=1", "train.grad_accum=2"]),
        "dp2-zero3": (2, ["parallel.tp=1", "parallel.zero=3", "train.grad_accum=2"])})


def corruption(pentad, recipe, work):
    ckpt, out = work / "corrupt-ckpt", work / "corrupt"
    train(pentad, recipe, 1, out, ["train.stop_at=10", "train.save_every=5", f"train.ckpt_dir={ckpt}"])
    newest = ckpt / "step-00000010" / "rank-00000.h5"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the tensor data (the metadata sits at the start)
    newest.write_bytes(bytes(data))
    damaged = newest.read_bytes()
    log = train(pentad, recipe, 1, work / "corrupt-resumed",
                [f"train.ckpt_dir={ckpt}", "train.stop_at=10", "train.save_every=5"],
                ["--resume", "latest"])
    check("checksum" in log and "rank-00000.h5" in log and "tensor" in log,
          "corrupt checkpoint: the warning names the file, the tensor and the checksum")
    check("at step 5" in log, "corrupt checkpoint: fell back to the previous one (step 5)")
    kept = ckpt / "unloadable" / "step-00000010" / "rank-00000.h5"
    check(kept.exists() and kept.read_bytes() == damaged and
          (ckpt / "step-00000010" / "manifest.json").exists(),
          "corrupt checkpoint: moved to unloadable/ as it was, not written over by the new step 10")


def mirror(pentad, recipe, work):
    local, shared, out = work / "mirror-local", work / "mirror-shared", work / "mirror"
    train(pentad, recipe, 1, out, ["train.stop_at=10", "train.save_every=10",
                                   f"train.ckpt_dir={local}", f"train.ckpt_mirror={shared}"])
    check((shared / "step-00000010" / "manifest.json").exists(), "mirror: the second level holds step 10")
    shutil.rmtree(local)  # the local disk is lost
    log = train(pentad, recipe, 1, work / "mirror-resumed",
                [f"train.ckpt_dir={local}", f"train.ckpt_mirror={shared}"], ["--resume", "latest"])
    check("at step 10" in log and "mirror-shared" in log, "mirror: resumed from the second level")


def committed(ckpt):
    return [m for m in ckpt.glob("step-*/manifest.json") if not m.parent.name.endswith(".partial")]


def sigkill_trials(pentad, recipe, work, trials=10 if os.environ.get("PENTAD_FULL_TESTS") else 4):
    rng = random.Random(1234)
    for trial in range(trials):
        ckpt, out = work / f"kill-ckpt-{trial}", work / f"kill-{trial}"
        cmd = pentad_cmd(pentad, recipe, 2, out, ["train.steps=100000", "train.save_every=1",
                                                  "train.keep_last=2", f"train.ckpt_dir={ckpt}"])
        proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Kill once a checkpoint is committed (before that there is nothing to resume), at a
        # random moment of the saves that follow: one every step.
        deadline = time.time() + 30
        while not committed(ckpt) and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 1.0))
        ranks = subprocess.run(["pgrep", "-f", f"train.out_dir={out}"], capture_output=True,
                               text=True).stdout.split()
        ranks = [p for p in ranks if Path(f"/proc/{p}/exe").exists() and
                 os.path.realpath(f"/proc/{p}/exe") == os.path.realpath(pentad)]
        if ranks:
            os.kill(int(rng.choice(ranks)), signal.SIGKILL)
        proc.wait(timeout=60)
        log = train(pentad, recipe, 1, work / f"kill-resumed-{trial}",
                    ["train.steps=100000", "train.stop_at=1", f"train.ckpt_dir={ckpt}"],
                    ["--resume", "latest"], check=False)
        resumed = "resumed from" in log and "cannot resume" not in log
        check(resumed, f"SIGKILL trial {trial + 1}: the latest committed checkpoint loads")
        shutil.rmtree(out, ignore_errors=True)


def files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the tensor data (the metadata sits at the start)
    path.write_bytes(bytes(data))


def refusals(pentad, recipe, work):
    ckpt = work / "refuse-ckpt"
    train(pentad, recipe, 1, work / "refuse", ["train.stop_at=4", "train.save_every=2",
                                               f"train.ckpt_dir={ckpt}"])
    before = files(ckpt)
    saving = [f"train.ckpt_dir={ckpt}", "train.save_every=2"]
    for change in ["model.n_layer=3", "model.d_model=128", "model.family=llama",
                   "model.rope_theta=500000.0", "model.norm_eps=1e-6", "model.max_seq_len=128"]:
        key = change.split("=")[0]
        rc, log = run_pentad(pentad, recipe, 1, work / "refuse-changed", saving + [change],
                             ["--resume", "latest"])
        check(rc != 0 and f"{key}:" in log and "resumed from" not in log and files(ckpt) == before,
              f"resume with {change}: refused naming {key}, checkpoint files untouched")
    rc, log = run_pentad(pentad, recipe, 1, work / "refuse-steps", [f"train.ckpt_dir={ckpt}",
                                                                     "train.steps=30"],
                         ["--resume", "latest"])
    check(rc == 0 and "at step 4" in log and "train.steps: 30" in log,
          "resume with train.steps changed: allowed, and the change logged")
    rc, log = run_pentad(pentad, recipe, 1, work / "refuse-fresh", saving)
    check(rc != 0 and str(ckpt) in log and "--resume latest" in log and files(ckpt) == before,
          "a fresh run saving into a directory of checkpoints: refused, files untouched")

    # An older checkpoint resumed into the directory of newer ones: refused, nothing written;
    # with train.retire_newer the newer ones move to retired/ byte for byte.
    older = [f"train.ckpt_dir={ckpt}", "train.save_every=2", "optim.lr=1e-4"]
    rc, log = run_pentad(pentad, recipe, 1, work / "refuse-older", older,
                         ["--resume", str(ckpt / "step-00000002")])
    check(rc != 0 and "step-00000004" in log and "train.retire_newer=true" in log and
          "train.ckpt_dir" in log and files(ckpt) == before,
          "resume of an older checkpoint beside newer ones: refused naming them, files untouched")
    retire = work / "refuse-retire"
    shutil.copytree(ckpt, retire)
    rc, log = run_pentad(pentad, recipe, 1, work / "refuse-retire-run",
                         [f"train.ckpt_dir={retire}", "train.save_every=2", "optim.lr=1e-4",
                          "train.stop_at=6", "train.retire_newer=true"],
                         ["--resume", str(retire / "step-00000002")])
    moved = files(retire / "retired")
    check(rc == 0 and moved == {k: v for k, v in before.items() if k.startswith("step-00000004/")}
          and (retire / "step-00000006" / "manifest.json").exists(),
          "train.retire_newer: the newer checkpoint moved to retired/ byte for byte, training on")

    corrupt = work / "refuse-corrupt"
    shutil.copytree(ckpt, corrupt)
    for f in corrupt.glob("step-*/rank-*.h5"):
        flip_byte(f)
    damaged = files(corrupt)
    rc, log = run_pentad(pentad, recipe, 1, work / "refuse-corrupt-run",
                         [f"train.ckpt_dir={corrupt}", "train.save_every=2"], ["--resume", "latest"])
    check(rc != 0 and "no checkpoint in" in log and files(corrupt) == damaged,
          "every checkpoint corrupt: refused to train from step 0 over them, files untouched")

    lost = work / "refuse-lost"
    shutil.copytree(ckpt, lost)
    (lost / "step-00000004" / "manifest.json").unlink()
    log = train(pentad, recipe, 1, work / "refuse-lost-run", [f"train.ckpt_dir={lost}"],
                ["--resume", "latest"])
    check("step-00000004 has no manifest.json" in log and "at step 2" in log,
          "a checkpoint without its manifest: named in a warning, the previous one resumed")


def disk_full(pentad, recipe, work):
    full = work / "full-disk"
    full.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(full)],
                             capture_output=True).returncode == 0
    if not mounted:
        print("skip a full disk: cannot mount a tmpfs here (not root)")
        return
    try:
        local, out = work / "full-local", work / "full-run"
        rc, log = run_pentad(pentad, recipe, 1, out, [
            "train.save_every=1", "train.max_failed_saves=3", f"train.ckpt_dir={local}",
            f"train.ckpt_mirror={full}"])
        lines = [l for l in log.splitlines() if "No space left" in l]
        check(rc != 0 and sorted(losses(out)) == [1, 2, 3],
              "full mirror: training stopped after train.max_failed_saves = 3 failed saves")
        check(len(lines) == 4 and all(str(full) in l and "bytes" in l for l in lines),
              "full mirror: each failure is one line naming the path, the errno text and bytes")
        check("HDF5" not in log, "full mirror: no HDF5 text in the log")
        check(list(full.iterdir()) == [], "full mirror: no .partial left on the full disk")
        check(len(committed(local)) == 3, "full mirror: the local level committed every save")
    finally:
        subprocess.run(["umount", str(full)])


def skipped_step(pentad, recipe, work):
    """A step whose gradients are NaN (train.inject_nan_grad, on one of two dp ranks) updates
    nothing: the weights after it are bitwise those of the run stopped before it."""
    nan, stopped = work / "nan-step3", work / "stopped-at2"
    log = train(pentad, recipe, 2, nan, ["parallel.tp=1", "train.steps=3",
                                         "train.inject_nan_grad=1:3"])
    train(pentad, recipe, 2, stopped, ["parallel.tp=1", "train.steps=3", "train.stop_at=2"])
    rows = [json.loads(l) for l in (nan / "metrics.jsonl").read_text().splitlines()]
    check(any(r.get("step") == 3 and r.get("skipped") for r in rows) and "not finite" in log,
          "NaN gradients at step 3: the step is reported skipped")
    wa, wb = weights(nan), weights(stopped)
    same = all(np.array_equal(wa[k].view(np.uint32), wb[k].view(np.uint32)) for k in wa)
    check(same and wa.keys() == wb.keys(), "the skipped step left every weight bitwise as it was")


def init_from(pentad, recipe, work):
    source = work / "refuse-ckpt"  # steps 2 and 4 of a one-rank run: its weights at step 4
    out = work / "init-tp2"
    log = train(pentad, recipe, 2, out, ["parallel.tp=2", "train.steps=0",
                                         f"train.init_from={source}"])
    wa, wb = weights(work / "refuse"), weights(out)
    same = wa.keys() == wb.keys() and all(np.array_equal(wa[k].view(np.uint32),
                                                         wb[k].view(np.uint32)) for k in wa)
    check(same and "step-00000004" in log, "init_from a root: its newest weights under tp2, bitwise")
    fresh, tuned = work / "init-fresh", work / "init-tuned"
    train(pentad, recipe, 1, fresh, ["train.steps=2"])
    log = train(pentad, recipe, 1, tuned, ["train.steps=2", "train.save_every=2",
                                           f"train.ckpt_dir={work / 'init-ckpt'}",
                                           f"train.init_from={source / 'step-00000002'}"])
    a, b = losses(fresh), losses(tuned)
    saved = json.loads((work / "init-ckpt" / "step-00000002" / "manifest.json").read_text())
    check(sorted(b) == [1, 2] and a[1] != b[1] and "optimizer fresh, step 0" in log,
          "init_from a checkpoint: trains from step 0 on its weights")
    check(saved["optimizer_steps"] == 2, "init_from a checkpoint (of 2 AdamW steps): the optimizer "
          f"starts fresh ({saved['optimizer_steps']} steps after 2 more)")
    rc, log = run_pentad(pentad, recipe, 1, work / "init-other", ["model.n_layer=3",
                                                                  f"train.init_from={source}"])
    check(rc != 0 and "model.n_layer:" in log, "init_from another model: refused naming the key")


def main():
    pentad, recipe, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    COMMON.extend(sys.argv[4:])
    subprocess.run(["umount", str(work / "full-disk")], capture_output=True)  # an interrupted run
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    bitwise_resume(pentad, recipe, work, "one-rank", 1, ["train.grad_accum=2"])
    ckpt = bitwise_resume(pentad, recipe, work, "dp2xtp2", 4,
                          ["parallel.tp=2", "parallel.sequence_parallel=true", "train.grad_accum=2"])
    reshard(pentad, recipe, work, ckpt, "dp2xtp2", {
        "one rank": (1, ["train.grad_accum=4"]),
        "tp4": (4, ["parallel.tp=4", "train.grad_accum=4"]),
        "dp4": (4, ["parallel.tp=1", "train.grad_accum=1"]),
        "pp2xtp2": (4, ["parallel.pp=2", "parallel.tp=2", "train.grad_accum=4"]),
        "tp4-2x2-column": (4, ["parallel.tp=4", "parallel.tp_shape=2x2", "parallel.tp_order=column",
                               "train.grad_accum=4"])})
    # 2D tp: blocks cut along both dims resume bitwise and reshard to one rank and to 1D tp.
    ckpt = bitwise_resume(pentad, recipe, work, "tp4-2x2", 4,
                          ["parallel.tp=4", "parallel.tp_shape=2x2", "train.grad_accum=4"])
    reshard(pentad, recipe, work, ckpt, "tp4-2x2", {
        "one rank": (1, ["train.grad_accum=4"]),
        "dp2xtp2+sp": (4, ["parallel.tp=2", "parallel.sequence_parallel=true",
                           "train.grad_accum=2"])})
    # Pipeline layouts: the tied embedding is saved once (by the first stage) and loads into
    # both ends; a pp2 x dp2 checkpoint reshards to one rank and to tp2.
    ckpt = bitwise_resume(pentad, recipe, work, "pp2xdp2", 4,
                          ["parallel.pp=2", "parallel.tp=1", "train.grad_accum=2"])
    reshard(pentad, recipe, work, ckpt, "pp2xdp2", {
        "one rank": (1, ["train.grad_accum=4"]),
        "tp2": (2, ["parallel.tp=2", "train.grad_accum=4"]),
        "pp2-zb-h1": (2, ["parallel.pp=2", "parallel.pp_schedule=zb-h1", "train.grad_accum=4"])})
    # Zero-bubble: zb-v (chunks in a V, the tied embedding's two uses on one stage, its lists
    # rebuilt from measured passes every 3 steps) over dp 2 at ZeRO-2 (each chunk's gradients
    # reduce-scattered after each W, the state saved as shares) resumes bitwise and reshards
    # to one rank and to 1F1B.
    layers = ["model.n_layer=4", "train.grad_accum=4"]
    ckpt = bitwise_resume(pentad, recipe, work, "pp2xdp2-zb-v-zero2", 4,
                          ["model.n_layer=4", "train.grad_accum=2", "parallel.tp=1",
                           "parallel.pp=2", "parallel.pp_schedule=zb-v",
                           "parallel.virtual_stages=2", "parallel.pp_adapt_every=3",
                           "parallel.zero=2"])
    reshard(pentad, recipe, work, ckpt, "pp2xdp2-zb-v-zero2", {
        "one rank": (1, layers),
        "pp2-1f1b": (2, layers + ["parallel.pp=2"])})
    zero_checkpoints(pentad, recipe, work)
    swap_equals_copy(pentad, recipe, work)
    recycled_files(pentad, recipe, work)
    corruption(pentad, recipe, work)
    mirror(pentad, recipe, work)
    refusals(pentad, recipe, work)
    disk_full(pentad, recipe, work)
    init_from(pentad, recipe, work)
    skipped_step(pentad, recipe, work)
    sigkill_trials(pentad, recipe, work)
    finish("checkpoints resume exactly")


if __name__ == "__main__":
    main()
