#!/usr/bin/env python3
"""The in-memory checkpoint level (checkpoint.memory_every; checkpoint/memory_level.h) on one
rank of gpt-tiny: files every 4 steps, a snapshot in memory every step, the run killed
(SIGKILL) in the middle of step 11 (its steps made slow from step 9 on, train.inject_fault
"slow", and the kill sent 50 ms after step 10's row is logged, when step 10's snapshot
(about 2 MB) has long been copied), so that the newest file is step 8 and memory holds 10 and 9.

1. A fresh run beside the snapshots (the checkpoint files moved away), and `--resume` of the
   file of step 8, are refused (naming the snapshots; nothing written over them).
2. The newest slot damaged (a flipped byte): `--resume latest` names the file and tensor,
   falls back to the other slot (step 9), not to the file of step 8, and every loss and the
   final weights equal an uninterrupted run's bitwise; the level's files are gone at the end.
3. The same kill with the ranks' layout changed at the restart (tp 2 on 2 ranks): memory is
   not resharded; the restart takes the file and sets the snapshots aside, saying where.
4. One rank resuming a killed two-rank job: the slots of rank 1 (past the new job's ranks) are
   set aside or deleted, never left live.
5. Slots that cannot be allocated: a warning, the level off, the run goes on.

usage: memory_level.py PENTAD RECIPE WORK_DIR
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import time

PENTAD, RECIPE, WORK = (os.path.abspath(a) for a in sys.argv[1:4])
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1")
ENV.pop("PENTAD_LAUNCH_ATTEMPT", None)
SHM = os.path.join(WORK, "shm")
COMMON = ["train.eval_every=0", "train.threads=1", "data.source=random", "train.micro_batch=2",
          "train.seq_len=32", "train.log_every=100", "train.save_every=4", "train.steps=16",
          "checkpoint.memory_every=1", f"checkpoint.memory_dir={SHM}"]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def command(out, extra=(), ranks=1, resume=None):
    cmd = ([] if ranks == 1 else ["mpirun", "--oversubscribe", "-np", str(ranks)])
    cmd += [PENTAD, "train", RECIPE] + (["--resume", resume] if resume else [])
    for o in COMMON + list(extra) + [f"train.out_dir={out}"]:
        cmd += ["--set", o]
    return cmd


def train(out, extra=(), ranks=1, resume=None):
    p = subprocess.run(command(out, extra, ranks, resume), env=ENV, capture_output=True,
                       text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def killed_in_step_11(out, extra=()):
    """Trains until step 10 is logged, then SIGKILL in the middle of step 11."""
    p = subprocess.Popen(command(out, list(extra) + ["train.inject_fault=slow:0:9:200"]),
                         env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = os.path.join(out, "metrics.jsonl")
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(metrics) and 10 in losses(out):
            time.sleep(0.05)
            break
        time.sleep(0.01)
    p.kill()
    p.wait()
    return 11 not in losses(out)


def losses(out):
    last = {}
    for line in open(os.path.join(out, "metrics.jsonl")):
        row = json.loads(line)
        if "loss" in row and "eval_loss" not in row:
            last[row["step"]] = row["loss"]
    return last


def checksums(out):
    """Every tensor's checksum in the final checkpoint (step 16): the weights, bitwise."""
    manifest = json.load(open(os.path.join(out, "checkpoints", "step-00000016", "manifest.json")))
    return sorted((s["name"], s["checksum"]) for s in manifest["shards"])


def snapshots():
    return sorted(os.path.basename(f) for f in glob.glob(os.path.join(SHM, "*")))


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    ref = os.path.join(WORK, "reference")
    rc, log = train(ref)
    check(rc == 0, "the uninterrupted run finished")
    check("in-memory checkpoints" in log, "the memory plan counts the level's two slots")
    check(not snapshots(), f"no snapshot left after a run that ended ({snapshots()})")

    out = os.path.join(WORK, "killed")
    check(killed_in_step_11(out), "the run was killed in step 11")
    left = snapshots()
    check(len(left) == 4, f"two slots and their indexes outlived it ({left})")
    state = {f: open(os.path.join(SHM, f), "rb").read() for f in left}

    files, moved = os.path.join(out, "checkpoints"), os.path.join(WORK, "moved")
    os.rename(files, moved)  # the files' own refusal comes first where they are there
    rc, log = train(out)
    os.rename(moved, files)
    check(rc != 0 and "in-memory snapshots of an earlier run" in log,
          "a fresh run beside the snapshots (the files moved away) is refused, naming them")
    rc, log = train(out, resume=os.path.join(out, "checkpoints", "step-00000008"))
    check(rc != 0 and "holds a newer snapshot (step 10" in log,
          "--resume of the file of step 8 is refused: memory holds step 10")
    check(all(open(os.path.join(SHM, f), "rb").read() == b for f, b in state.items()),
          "the refusals left every snapshot byte-identical")

    # The newest slot (step 10) damaged: a byte of its second tensor's page flipped.
    newest = max((f for f in left if f.endswith(".json")),
                 key=lambda f: json.load(open(os.path.join(SHM, f)))["step"])
    with open(os.path.join(SHM, newest[:-len(".json")]), "r+b") as f:
        f.seek(4096 + 100)
        b = f.read(1)
        f.seek(4096 + 100)
        f.write(bytes([b[0] ^ 0x40]))
    rc, log = train(out, resume="latest")
    check(rc == 0, "--resume latest finished the run")
    check("in-memory snapshot of step 10" in log and "fails its checksum" in log,
          "the damaged slot is named (file and tensor) in a warning")
    check("resumed from the in-memory snapshot of step 9" in log,
          "it fell back to the other slot (step 9), not the file of step 8")
    check(losses(out) == losses(ref), "every loss bitwise the uninterrupted run's")
    check(checksums(out) == checksums(ref), "the final weights and moments bitwise the same")
    check(not snapshots(), f"the level's files are gone at the end ({snapshots()})")

    # Another layout at the restart: the files, and the snapshots set aside.
    out = os.path.join(WORK, "relayout")
    killed_in_step_11(out)
    rc, log = train(out, ["parallel.tp=2"], ranks=2, resume="latest")
    check(rc == 0, "the tp 2 restart finished")
    check("resumed from" in log and "step-00000008" in log,
          "tp 2: resumed from the file of step 8")
    aside = [f for f in snapshots() if f.endswith(".unloadable")]
    check(len(aside) == 4 and "moved to" in log,
          f"tp 2: the one-rank snapshots set aside as .unloadable, said in a warning ({aside})")
    # Fewer ranks after more: the slots of the ranks past the new job's are set aside (or, with
    # nothing newer than the resumed file, deleted), never left live.
    out, shrink = os.path.join(WORK, "shrink"), os.path.join(WORK, "shm-shrink")
    extra = [f"checkpoint.memory_dir={shrink}"]
    train(out, extra + ["parallel.tp=2", "train.inject_fault=kill:1:11"], ranks=2)
    before = sorted(os.listdir(shrink))
    rc, log = train(out, extra, resume="latest")
    after = sorted(os.listdir(shrink))
    check(rc == 0 and any("-rank-00001." in f for f in before),
          f"one rank resumed a killed two-rank job that left rank 1's slots ({before})")
    check(all(f.endswith(".unloadable") for f in after) and
          ("-rank-00001" in log) == any("-rank-00001." in f for f in after),
          f"rank 1's slots are set aside (said in a warning) or deleted, none left live ({after})")

    # Slots that cannot be allocated (here: memory_dir under a file) cost the level, not the run.
    blocked = os.path.join(WORK, "a-file")
    open(blocked, "w").close()
    rc, log = train(os.path.join(WORK, "no-room"), [f"checkpoint.memory_dir={blocked}/shm"])
    check(rc == 0 and "the in-memory level is off for this run" in log,
          "slots that cannot be allocated: a warning, and the run trains on with its files")
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("the in-memory level resumes what it holds and loses nothing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
