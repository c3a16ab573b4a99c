#!/usr/bin/env python3
"""AdamW state offloaded to NVMe (parallel.offload = "nvme", optim/nvme_state.h), and at
zero = 3 the parameter shares with it (ZeRO-Infinity's parameter offload).

1. Bitwise: one rank, dp2 zero-1, zero-2 and zero-3, each with its state in a file streamed in
   sub-groups of 64 KiB (many per step) against the same run in memory: every loss and
   every final weight bitwise equal. Zero-3 twice: with the parameter shares on NVMe (the
   default; grad_accum 2 and an evaluation between steps, so that units are read ahead,
   gathered and dropped in every order the hooks take) and with them kept in memory
   (parallel.offload_params = false). MoE at zero 3 (dp4 x ep2: the experts' shares over
   edp 2, the expert bias moved after every update) likewise, with the shares on NVMe (the
   experts' reducer reads its units' from the same file) and kept in memory; its checkpoints
   with the shares on NVMe byte-identical to the in-memory run's, and the step-3 checkpoint
   of each resumed with the shares on NVMe ends bitwise on the in-memory run. And zero-3
   with its shares on NVMe resumed from the in-memory run's step-4 checkpoint (the loaded
   shares go to the file) ends bitwise on that run's weights.
   Checkpoints of the offloaded state (saved every 3 steps, the saver's background thread
   started late, so that a step that rewrote the state before it was read would show):
   one rank and dp2 zero 3 with the shares on NVMe write rank files byte-identical to the
   same runs in memory (checkpoint.snapshot = copy); dp2 zero 3 resumed from its step-3
   NVMe checkpoint onto NVMe ends bitwise on the run that did not stop; that checkpoint
   resumed in memory on one rank, and the one-rank NVMe checkpoint resumed onto dp2 zero 3
   with the shares on NVMe, each end bitwise where the same resume of the in-memory
   checkpoint ends.
2. Memory: a model whose plan (470 MiB, 225 MiB of it AdamW state) is over
   train.memory_limit_mb = 350 is refused without offload, the message naming
   parallel.offload = "nvme"; with it (sub-groups of 2 MiB: 12 MiB of buffers) the plan
   fits and the process's peak resident memory, measured, less the same binary's baseline
   (its peak on gpt-tiny's own 0.1M-value model: libraries, MPI, and in a CUDA build
   cudart and cuBLASLt, whose pages alone are 40-170 MiB), stays under the limit.
   At dp2 zero 3 (a 31.6M-value model), the per-rank peak with the parameter shares on
   NVMe against the same run keeping them in memory: lower by more than a third of a
   rank's shares (the shares' bytes less the third tensor's buffers and the read-ahead's
   staging is what should go), and the memory plan lower by the shares less this rank's
   part of the units whole at once and of the shares read ahead (half to all of them).
3. Bad offload paths, each refused before training with the path in the message: a
   directory that does not exist, one that cannot be one (/dev/null/x), and a file system
   too small for the state (a 1 MiB tmpfs, where this runs as root: "No space left" and
   the bytes needed). The checkpoint the run resumed from is still loadable afterwards.

usage: zero_offload.py PENTAD RECIPE WORKDIR [checkpoints]
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from shards import load_weights

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1")
COMMON = ["train.eval_every=0", "train.threads=1", "data.source=random", "train.micro_batch=2",
          "train.seq_len=32", "train.log_every=100"]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def command(pentad, recipe, ranks, out, overrides, extra=()):
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] if ranks > 1 else []
    cmd += [pentad, "train", recipe, "--dump-weights", str(out / "weights"), *extra]
    for o in COMMON + overrides + [f"train.out_dir={out}"]:
        cmd += ["--set", o]
    return cmd


def train(pentad, recipe, ranks, out, overrides, extra=(), expect_ok=True, env=ENV):
    """Returns (exit code, output, peak resident bytes of the process; one rank only)."""
    proc = subprocess.Popen(command(pentad, recipe, ranks, out, overrides, extra), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    if expect_ok and code != 0:
        print(output[-3000:])
        raise SystemExit(f"pentad failed in {out}")
    return code, output, usage.ru_maxrss * 1024


def losses(out):
    return [json.loads(l)["loss"] for l in (out / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in l]


def same_weights(a_dir, b_dir):
    a, b = load_weights(a_dir / "weights"), load_weights(b_dir / "weights")
    return a.keys() == b.keys() and all(
        np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in a)


def bitwise(pentad, recipe, work):
    path = work / "offload"
    path.mkdir()
    nvme = [f"parallel.offload_path={path}", "parallel.nvme_subgroup_kb=64",
            "parallel.nvme_block_kb=16", "parallel.offload=nvme"]
    zero3 = ["parallel.zero=3", "train.grad_accum=2", "train.eval_every=3"]
    for name, ranks, layout, extra, plan in [
            ("one-rank", 1, [], [], "AdamW state on NVMe:"),
            ("dp2-zero1", 2, ["parallel.zero=1"], [], "AdamW state on NVMe:"),
            ("dp2-zero2", 2, ["parallel.zero=2", "train.grad_accum=2"], [],
             "AdamW state on NVMe:"),
            ("dp2-zero3", 2, zero3, [], "parameters: none resident"),
            ("dp2-zero3", 2, zero3, ["parallel.offload_params=false"],
             "of this rank's shares stay")]:
        label = name + (" (parameters in memory)" if extra else "")
        memory = work / f"{name}-none"
        if not memory.exists():
            train(pentad, recipe, ranks, memory, layout + ["train.steps=8"])
        out = work / f"{name}-nvme{'-keep' if extra else ''}"
        _, log, _ = train(pentad, recipe, ranks, out, layout + ["train.steps=8"] + nvme + extra)
        check(plan in log, f"{label}: the plan says '{plan}'")
        check(losses(memory) == losses(out) and len(losses(memory)) == 8,
              f"{label}: 8 losses bitwise equal with the state on NVMe")
        check(same_weights(memory, out), f"{label}: final weights bitwise equal")
    moe_zero3(pentad, str(Path(recipe).parent / "moe-fine-tiny.toml"), work, nvme)
    # Zero-3 resumed onto NVMe: the in-memory run again, saving at step 4.
    saved, ckpt = work / "dp2-zero3-saved", work / "dp2-zero3-ckpt"
    train(pentad, recipe, 2, saved, zero3 + ["train.steps=8", "train.save_every=4",
                                             f"train.ckpt_dir={ckpt}"])
    out = work / "dp2-zero3-nvme-resumed"
    _, log, _ = train(pentad, recipe, 2, out, zero3 + ["train.steps=8"] + nvme,
                      ["--resume", str(ckpt / "step-00000004")])
    check("at step 4" in log and same_weights(saved, out),
          "dp2-zero3 resumed at step 4 with the shares on NVMe: final weights bitwise equal")
    check(not any(path.iterdir()), "the state files are gone after the runs")


def moe_zero3(pentad, moe, work, nvme):
    """MoE at zero 3 (dp4 x ep2: the dense shares over dp 4, the experts' over edp 2), with
    the aux-loss-free bias moving every step, AdamW's state on NVMe and the parameter shares
    on NVMe or in memory, each saving every 3 steps; resumed at step 3 onto NVMe."""
    layout = ["parallel.ep=2", "parallel.zero=3", "model.n_layer=4", "train.steps=6",
              "train.grad_accum=2", "train.eval_every=3", "moe.bias_update_rate=0.01",
              "train.save_every=3", "checkpoint.snapshot=copy"]
    runs = {}
    for kind, extra in [("memory", []), ("nvme-keep", nvme + ["parallel.offload_params=false"]),
                        ("nvme", nvme)]:
        runs[kind] = work / f"moe-zero3-{kind}"
        train(pentad, moe, 4, runs[kind], layout + extra + [f"train.ckpt_dir={runs[kind]}/ckpt"],
              env=dict(ENV, PENTAD_SAVER_DELAY_MS="300"))
    memory = runs["memory"]
    for kind, label in [("nvme-keep", "parameters in memory"), ("nvme", "parameters on NVMe")]:
        check(losses(memory) == losses(runs[kind]) and len(losses(memory)) == 6 and
              same_weights(memory, runs[kind]),
              f"dp4xep2 MoE zero-3 ({label}): 6 losses and final weights bitwise equal with "
              f"the state on NVMe")
    files = [rank_files(runs[kind] / "ckpt") for kind in ("memory", "nvme")]
    check(len(files[0]) == 8 and files[0] == files[1],
          f"dp4xep2 MoE zero-3: {len(files[1])} checkpoint rank files with the parameter shares "
          f"on NVMe byte-identical to the in-memory run's")
    for source in ("memory", "nvme"):
        out = work / f"moe-zero3-{source}-resumed-nvme"
        _, log, _ = train(pentad, moe, 4, out, layout[:-2] + nvme,
                          ["--resume", str(runs[source] / "ckpt" / "step-00000003")])
        check("at step 3" in log and same_weights(memory, out),
              f"dp4xep2 MoE zero-3 resumed at step 3 from its {source} checkpoint with the "
              f"parameter shares on NVMe: final weights bitwise equal")


def rank_files(ckpt):
    """{step-dir/rank-file: bytes} of every committed checkpoint under ckpt."""
    return {str(f.relative_to(ckpt)): f.read_bytes() for f in sorted(ckpt.glob("step-*/*.h5"))}


def checkpoints(pentad, recipe, work):
    path = work / "offload-ckpt"
    path.mkdir()
    nvme = [f"parallel.offload_path={path}", "parallel.nvme_subgroup_kb=64",
            "parallel.nvme_block_kb=16", "parallel.offload=nvme"]
    zero3 = ["parallel.zero=3", "train.grad_accum=2", "train.eval_every=3"]
    saving = ["train.steps=7", "train.save_every=3", "checkpoint.snapshot=copy"]
    late = dict(ENV, PENTAD_SAVER_DELAY_MS="300")
    runs = {}
    for name, ranks, layout in [("one-rank", 1, []), ("dp2-zero3", 2, zero3)]:
        for kind, extra in [("memory", []), ("nvme", nvme)]:
            out = work / f"ckpt-{name}-{kind}"
            _, log, _ = train(pentad, recipe, ranks, out, layout + saving + extra +
                              [f"train.ckpt_dir={out / 'ckpt'}"], env=late)
            runs[name, kind] = out
        files = [rank_files(runs[name, kind] / "ckpt") for kind in ("memory", "nvme")]
        check(len(files[0]) == 3 * ranks and files[0] == files[1],
              f"{name}: {len(files[1])} NVMe checkpoint rank files byte-identical to the "
              f"in-memory run's")
        check("of NVMe-offloaded state read into the snapshot" in log,
              f"{name}: each save logs its read of the file")
    # dp2 zero 3 from its NVMe checkpoint onto NVMe, against the run that did not stop.
    out = work / "ckpt-dp2-zero3-nvme-resumed"
    _, log, _ = train(pentad, recipe, 2, out, zero3 + ["train.steps=7"] + nvme,
                      ["--resume", str(runs["dp2-zero3", "nvme"] / "ckpt" / "step-00000003")])
    check("at step 3" in log and same_weights(runs["dp2-zero3", "nvme"], out),
          "dp2-zero3 resumed at step 3 from NVMe onto NVMe: final weights bitwise equal")
    # Across layouts: each NVMe checkpoint resumed elsewhere, against the in-memory one.
    for source, ranks, layout, extra, label in [
            ("dp2-zero3", 1, [], [], "dp2-zero3 NVMe checkpoint resumed in memory on one rank"),
            ("one-rank", 2, zero3, nvme, "one-rank NVMe checkpoint resumed onto dp2-zero3 NVMe")]:
        ends = []
        for kind in ("memory", "nvme"):
            out = work / f"ckpt-{source}-{kind}-elsewhere"
            train(pentad, recipe, ranks, out, layout + ["train.steps=7"] + extra,
                  ["--resume", str(runs[source, kind] / "ckpt" / "step-00000003")])
            ends.append(out)
        check(same_weights(*ends), f"{label}: bitwise where the in-memory checkpoint's ends")
    check(not any(path.iterdir()), "the state files are gone after the checkpointed runs")


def peak_mib(log):
    """The highest rank's peak resident memory, from the end-of-run line."""
    return int(re.search(r"peak resident memory per rank: \d+ to (\d+) MiB", log).group(1))


def parameter_offload_memory(pentad, recipe, work):
    path = work / "params-offload"
    path.mkdir()
    layout = ["model.n_layer=16", "model.d_model=384", "model.n_head=6", "model.vocab_size=8192",
              "train.steps=3", "parallel.zero=3", "parallel.offload=nvme",
              f"parallel.offload_path={path}", "parallel.nvme_subgroup_kb=1024"]
    # PENTAD_POISON fills every arena as it is made, the reduced gradients' while the whole
    # parameter arena is still there at start-up: that peak would hide the one measured.
    env = dict(ENV, PENTAD_POISON="0")
    _, on, _ = train(pentad, recipe, 2, work / "params-nvme", layout, env=env)
    _, kept, _ = train(pentad, recipe, 2, work / "params-kept",
                       layout + ["parallel.offload_params=false"], env=env)
    shares = int(re.search(r"this rank's shares (\d+) of", on).group(1)) * 4 / 2**20
    plan = [float(re.search(r"memory plan .*?parameters ([\d.]+) MiB", log).group(1))
            for log in (on, kept)]
    peaks = [peak_mib(on), peak_mib(kept)]
    print(f"     dp2 zero 3, a rank's parameter shares {shares:.1f} MiB: peak resident memory "
          f"{peaks[0]} MiB with them on NVMe, {peaks[1]} MiB kept in memory (plan: parameters "
          f"{plan[0]:.1f} and {plan[1]:.1f} MiB)")
    check(peaks[1] - peaks[0] > shares / 3,
          f"the shares on NVMe lower the peak by more than a third of them "
          f"({peaks[1] - peaks[0]} MiB of {shares:.1f})")
    # The plan: the shares less this rank's part of the units whole at once (gathered whole,
    # its own share with them) and of the shares read ahead: at dp 2 more than half of them.
    check(shares / 2 < plan[1] - plan[0] < shares,
          f"and the memory plan by the shares less those gathered with their units "
          f"({plan[1] - plan[0]:.1f} MiB of {shares:.1f})")


BIG = ["model.n_layer=8", "model.d_model=512", "model.n_head=8", "model.vocab_size=8192",
       "train.steps=3", "train.memory_limit_mb=350"]


def memory_limit(pentad, recipe, work):
    code, log, _ = train(pentad, recipe, 1, work / "big-none", BIG, expect_ok=False)
    check(code != 0 and "does not fit" in log and 'parallel.offload = "nvme"' in log,
          "over train.memory_limit_mb without offload: refused, naming parallel.offload = nvme")
    path = work / "big-offload"
    path.mkdir()
    code, log, peak = train(pentad, recipe, 1, work / "big-nvme",
                            BIG + ["parallel.offload=nvme", f"parallel.offload_path={path}",
                                   "parallel.nvme_subgroup_kb=2048"])
    _, _, baseline = train(pentad, recipe, 1, work / "baseline", ["train.steps=3"])
    limit = 350 * 2**20
    print(f"     peak resident memory with the state on NVMe: {peak / 2**20:.1f} MiB, the "
          f"binary's baseline {baseline / 2**20:.1f} MiB (limit {limit / 2**20:.0f} MiB)")
    check(code == 0 and len(losses(work / "big-nvme")) == 3, "with offload = nvme it trains")
    check(peak - baseline < limit,
          f"and stays under the limit ({(peak - baseline) / 2**20:.1f} MiB over the baseline)")


def bad_paths(pentad, recipe, work):
    ckpt = work / "ckpt"
    train(pentad, recipe, 1, work / "saved", ["train.steps=4", "train.save_every=4",
                                               f"train.ckpt_dir={ckpt}"])
    full = work / "full"
    full.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(full)],
                             capture_output=True).returncode == 0
    cases = [("missing", str(work / "no-such-dir"), ["does not exist"]),
             ("not a directory", "/dev/null/x", ["/dev/null/x"])]
    if mounted:
        cases.append(("full", str(full), ["No space left", "bytes"]))
    else:
        print("     (no tmpfs mount here: the full file system case is skipped)")
    try:
        for name, where, words in cases:
            code, log, _ = train(pentad, recipe, 1, work / f"bad-{name}",
                                 ["train.steps=8", "parallel.offload=nvme",
                                  f"parallel.offload_path={where}", f"train.ckpt_dir={ckpt}"],
                                 ["--resume", "latest"], expect_ok=False)
            lines = [l for l in log.splitlines() if where in l]
            check(code != 0 and lines and all(w in lines[0] for w in words),
                  f"offload_path {name}: refused, naming the path" +
                  (f": {lines[0].strip()[:160]}" if lines else ""))
    finally:
        if mounted:
            subprocess.run(["umount", str(full)], capture_output=True)
    code, log, _ = train(pentad, recipe, 1, work / "after", ["train.steps=8",
                                                              f"train.ckpt_dir={ckpt}"],
                         ["--resume", "latest"], expect_ok=False)
    check(code == 0 and "at step 4" in log, "the checkpoint still resumes afterwards")


def main():
    pentad, recipe, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    subprocess.run(["umount", str(work / "full")], capture_output=True)  # an interrupted run
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if len(sys.argv) > 4 and sys.argv[4] == "checkpoints":  # that part alone
        checkpoints(pentad, recipe, work)
        sys.exit(1 if failures else 0)
    bitwise(pentad, recipe, work)
    checkpoints(pentad, recipe, work)
    memory_limit(pentad, recipe, work)
    parameter_offload_memory(pentad, recipe, work)
    bad_paths(pentad, recipe, work)
    if failures:
        print("FAILED:", "; ".join(failures))
        sys.exit(1)
    print("offloaded state trains exactly")


if __name__ == "__main__":
    main()
