#!/usr/bin/env python3
"""Recovery from the survivors' memory (issue 48, part 4) under `pentad launch`: 4 ranks of
gpt-tiny, a save every 10 steps, rank 2 killed at the start of step 17.

- dp 4 (every shard has replicas): on mpirun's SIGTERM each survivor writes its state of step 16
  (checkpoint.h, write_survivor); the restart's --resume latest adopts it as a committed
  checkpoint and resumes at step 16: no step redone (the newest file was step 10, or none yet),
  every loss bitwise the uninterrupted run's, no survivors' directory left at the end.
- dp 4 with ZeRO-1 (each rank alone holds its share of the AdamW moments): the survivors' files
  miss the dead rank's share; not adopted, saying so, and the restart takes the newest file.
- pp 2 x dp 2 with ZeRO-1 and the in-memory level (checkpoint.memory_every = 1): every rank's
  snapshot of step 16 (or 15, where the killed rank died before its copy of 16 was whole)
  outlived the processes; the restart resumes from it, not from the file of step 10, every
  loss bitwise an uninterrupted run's of that layout, and the level's files are gone at the
  end.

usage: survivors_test.py PENTAD RECIPE WORK_DIR
"""
import glob
import json
import os
import shutil
import subprocess
import sys

PENTAD, RECIPE, WORK = (os.path.abspath(a) for a in sys.argv[1:4])
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1")
for key in ("PENTAD_MONITOR", "PENTAD_INJECT_EVERY_ATTEMPT"):
    ENV.pop(key, None)
STEPS = 40
COMMON = ["train.eval_every=0", "train.threads=1", "data.source=random", "train.micro_batch=2",
          "train.grad_accum=2", "train.seq_len=32", "train.log_every=100", "train.save_every=10",
          "parallel.dp=4", f"train.steps={STEPS}"]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def train_cmd(out, extra=()):
    cmd = ["mpirun", "--oversubscribe", "-np", "4", PENTAD, "train", RECIPE]
    for o in COMMON + list(extra) + [f"train.out_dir={out}"]:
        cmd += ["--set", o]
    return cmd


def losses(out):
    last = {}
    for line in open(os.path.join(out, "metrics.jsonl")):
        row = json.loads(line)
        if "loss" in row and "eval_loss" not in row:
            last[row["step"]] = row["loss"]  # a resumed attempt's steps replace the first's
    return last


def launched(name, extra):
    out = os.path.join(WORK, name)
    p = subprocess.run([PENTAD, "launch", "--", *train_cmd(out, extra + ["train.inject_fault=kill:2:17"])],
                       env=ENV, capture_output=True, text=True, timeout=300)
    print("\n".join(l for l in (p.stdout + p.stderr).splitlines()
                    if l.startswith("pentad launch: resumed") or "--resume latest:" in l
                    or "in-memory snapshot" in l))
    check(p.returncode == 0, f"{name}: the job finished under pentad launch (status {p.returncode})")
    events = [json.loads(l) for l in open(os.path.join(out, "events.jsonl"))]
    resumed = next((e for e in events if e["event"] == "resumed"), {})
    return out, p.stdout + p.stderr, resumed


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    ref = os.path.join(WORK, "reference")
    p = subprocess.run(train_cmd(ref), env=ENV, capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, "the uninterrupted run finished")
    if p.returncode:
        print(p.stdout[-2000:], p.stderr[-2000:])
        return 1
    reference = losses(ref)

    out, log, resumed = launched("replicas", [])
    check("the survivors' state of step 16 adopted" in log,
          "the survivors' state of step 16 adopted as a checkpoint")
    check(resumed.get("resume_step") == 16 and resumed.get("steps_lost") == 0,
          f"resumed at step 16, no step redone (resume_step {resumed.get('resume_step')}, "
          f"steps_lost {resumed.get('steps_lost')})")
    got = losses(out)
    check(got == reference, "every loss bitwise the uninterrupted run's")
    left = glob.glob(os.path.join(out, "checkpoints", "*.survivors.*"))
    check(not left, f"no survivors' directory left ({left})")

    out, log, resumed = launched("zero1", ["parallel.zero=1"])
    # Why: most often the dead rank's shares missing; under load, ranks killed before they
    # finished their files ("no rank finished its file") also leave nothing to adopt.
    check("not adopted:" in log,
          "ZeRO-1: the survivors' files miss the dead rank's share, not adopted, saying why")
    check(0 <= resumed.get("resume_step", -1) < 16,
          f"ZeRO-1: resumed from the newest file instead (step {resumed.get('resume_step')})")
    check(sorted(losses(out)) == list(range(1, STEPS + 1)), f"ZeRO-1: every step 1..{STEPS} has a loss")
    shm = os.path.join(WORK, "shm")
    memory = ["parallel.zero=1", "parallel.dp=2", "parallel.pp=2", "checkpoint.memory_every=1",
              f"checkpoint.memory_dir={shm}"]
    ref1 = os.path.join(WORK, "reference-zero1")
    p = subprocess.run(train_cmd(ref1, memory), env=ENV, capture_output=True, text=True,
                       timeout=300)
    check(p.returncode == 0, "the uninterrupted pp 2 x dp 2 ZeRO-1 run with in-memory snapshots "
          "finished")
    out, log, resumed = launched("zero1_memory", memory)
    check("resumed from the in-memory snapshot of step" in log,
          "pp 2 x dp 2 ZeRO-1: the restart resumed from the in-memory level")
    check(resumed.get("resume_step", -1) in (15, 16),
          f"pp 2 x dp 2 ZeRO-1: resumed at step 15 or 16, past the file of step 10 "
          f"(resume_step {resumed.get('resume_step')})")
    check(losses(out) == losses(ref1),
          "pp 2 x dp 2 ZeRO-1: every loss bitwise the uninterrupted run's")
    left = os.listdir(shm) if os.path.isdir(shm) else []
    check(not left, f"the in-memory level's files are gone at the end ({left})")
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("the restart took the survivors' state where every shard had a replica")
    return 0


if __name__ == "__main__":
    sys.exit(main())
