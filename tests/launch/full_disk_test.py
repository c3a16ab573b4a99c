#!/usr/bin/env python3
"""A checkpoint file system filled, then freed, under `pentad launch` with its default
--max-restarts (issue 50), on 4 ranks of gpt-tiny saving every 10 steps to a small tmpfs:

- full for 3 s with the default train.failed_save_grace_s: the failed saves are warned about
  and tolerated, the run never stops (no restart);
- full for 3 s with the grace off (train.failed_save_grace_s = 0, the count alone, as
  before): the ranks stop after 3 failed saves, the supervisor waits for the space a save
  needs instead of restarting into the same error, then restarts once;
- full for good, with --storage-wait-s 3: the supervisor gives up after the wait in one line
  naming the file system and the space a save needs;
- (no tmpfs) a rank killed at the same step on every attempt: given up after the default 3
  restarts, the second and third after a backoff, every wait in events.jsonl.
Every loss of the runs that finish is bitwise that of an uninterrupted run that saves nothing.

Needs root to mount the tmpfs: otherwise it says so in one line and exits 77 (skipped).
The tmpfs is unmounted on every way out.

usage: full_disk_test.py PENTAD RECIPE WORK_DIR [FULL_S STEPS]
With FULL_S and STEPS, only the first case, with every default, full for FULL_S seconds in a
run of STEPS steps (the measurements of issue 50: 30 s and 3 minutes); it reports, checks
nothing, and needs a reference run of STEPS steps (made once, kept in WORK_DIR).
"""
import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time

PENTAD, RECIPE, WORK = sys.argv[1], sys.argv[2], os.path.abspath(sys.argv[3])
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1")
ENV.pop("PENTAD_MONITOR", None)
ENV.pop("PENTAD_INJECT_EVERY_ATTEMPT", None)
STEPS = int(sys.argv[5]) if len(sys.argv) > 5 else 1500  # outlasts 3 s of failing saves
COMMON = ["train.eval_every=0", "train.threads=1", "data.source=random", "train.micro_batch=2",
          "train.seq_len=32", "train.log_every=100", "parallel.tp=1", f"train.steps={STEPS}",
          "train.save_every=10"]
FILL_AT_STEP = 100  # a few checkpoints committed before the disk fills
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def train_cmd(out, overrides):
    cmd = ["mpirun", "--oversubscribe", "-np", "4", PENTAD, "train", RECIPE]
    for o in COMMON + overrides + [f"train.out_dir={out}"]:
        cmd += ["--set", o]
    return cmd


def records(out):
    """Every (step, loss) metrics.jsonl holds, a resumed run's repeated steps included."""
    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    rows = [json.loads(l) for l in open(path)]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r and "eval_loss" not in r]


def events(out):
    path = os.path.join(out, "events.jsonl")
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []


def last_step(out):
    steps = [s for s, _ in records(out)]
    return max(steps) if steps else 0


class Filler:
    """Keeps a file system full: tops up a file every 10 ms until stop()."""

    def __init__(self, where):
        self.path = os.path.join(where, "filler")
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        with open(self.path, "ab", buffering=0) as f:
            while not self.stopped.is_set():
                for size in (1 << 20, 4096, 512):
                    try:
                        while True:
                            f.write(b"\0" * size)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                time.sleep(0.01)

    def stop(self):
        self.stopped.set()
        self.thread.join()
        os.remove(self.path)


def filled(name, fs, overrides, options, full_s):
    """Starts the launch, fills fs at FILL_AT_STEP for full_s seconds (None: to the end)."""
    out, ckpt = os.path.join(WORK, name), os.path.join(fs, name)
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    os.makedirs(out)
    log = open(os.path.join(out, "launch.log"), "w")
    cmd = [PENTAD, "launch", *options, "--",
           *train_cmd(out, [f"train.ckpt_dir={ckpt}", *overrides])]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=ENV, stdout=log, stderr=subprocess.STDOUT, text=True)
    filler = None
    try:
        while p.poll() is None and last_step(out) < FILL_AT_STEP and time.monotonic() - t0 < 120:
            time.sleep(0.02)
        filler = Filler(fs)
        filled_at = time.monotonic()
        while full_s is None or time.monotonic() - filled_at < full_s:
            if p.poll() is not None:
                break
            time.sleep(0.05)
        if full_s is not None:
            filler.stop()
            filler = None
        p.wait(timeout=300)
    finally:
        if filler:
            filler.stop()
        if p.poll() is None:
            p.kill()
    log.close()
    shutil.rmtree(ckpt, ignore_errors=True)  # room for the next scenario
    text = open(os.path.join(out, "launch.log")).read()
    print(f"--- {name}: exit {p.returncode}, {time.monotonic() - t0:.1f} s\n" +
          "\n".join(l for l in text.splitlines() if l.startswith("pentad launch")), flush=True)
    return p.returncode, text, events(out), out


def bitwise(name, out, reference):
    got = records(out)
    wrong = [(s, l, reference.get(s)) for s, l in got if reference.get(s) != l]
    check(got and not wrong and sorted({s for s, _ in got}) == list(range(1, STEPS + 1)),
          f"{name}: all {STEPS} steps, every loss ({len(got)} records) bitwise the "
          f"uninterrupted run's" + (f" (first wrong: {wrong[:3]})" if wrong else ""))


def restarts(ev):
    return [e for e in ev if e.get("action") == "restart"]


def measure(fs, full_s):
    reference = dict(records(os.path.join(WORK, f"reference-{STEPS}")))
    rc, text, ev, out = filled(f"full-{full_s:g}s", fs, [], [], full_s)
    got = records(out)
    wrong = [(s, l) for s, l in got if reference.get(s) != l]
    print(f"full {full_s:g} s, defaults: exit {rc}, {len(restarts(ev))} restarts, "
          f"{text.count('not committed to')} failed saves, steps {max(s for s, _ in got)} of "
          f"{STEPS}, {len(got)} losses, {len(wrong)} not bitwise the reference's; waits "
          f"{[(e['why'], round(e['seconds'], 1)) for e in ev if e['event'] == 'waited']}")


def main():
    os.makedirs(WORK, exist_ok=True)
    fs = os.path.join(WORK, "ckpt-fs")
    os.makedirs(fs, exist_ok=True)
    subprocess.run(["umount", fs], capture_output=True)  # left by a killed earlier run
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", fs],
                      capture_output=True).returncode != 0:
        print("skipped: cannot mount a tmpfs here (needs root)")
        sys.exit(77)
    try:
        ref_out = os.path.join(WORK, f"reference-{STEPS}")
        if last_step(ref_out) != STEPS:
            shutil.rmtree(ref_out, ignore_errors=True)
            subprocess.run(train_cmd(ref_out, ["train.save_every=0"]), env=ENV, check=True,
                           capture_output=True)
        if len(sys.argv) > 5:
            return measure(fs, float(sys.argv[4]))
        reference = dict(records(ref_out))

        rc, text, ev, out = filled("grace", fs, [], [], 3.0)
        warned = text.count("not committed to")
        check(rc == 0 and not restarts(ev) and not [e for e in ev if e["event"] == "detection"]
              and warned >= 3 and text.count("training on:") == 1 and
              f"checkpoint: step {STEPS} committed" in text,
              f"full 3 s, default grace: {warned} failed saves warned about, no restart, "
              f"saving again once freed (exit {rc})")
        bitwise("full 3 s, default grace", out, reference)

        rc, text, ev, out = filled("count-only", fs, ["train.failed_save_grace_s=0"], [], 3.0)
        waits = [e for e in ev if e["event"] == "wait"]
        waited = [e for e in ev if e["event"] == "waited"]
        check(rc == 0 and len(restarts(ev)) == 1 and len(waits) == 1 and
              waits[0]["why"] == "checkpoint_space" and waits[0]["needed_bytes"] > 0 and
              len(waited) == 1 and waited[0]["cleared"] and 0.5 < waited[0]["seconds"] < 4.0,
              f"full 3 s, grace off: the supervisor waited {waited[0]['seconds'] if waited else '-'}"
              f" s for the space, then restarted once ({len(restarts(ev))} restarts, exit {rc})")
        bitwise("full 3 s, grace off", out, reference)

        rc, text, ev, out = filled("for-good", fs, ["train.failed_save_grace_s=0"],
                                   ["--storage-wait-s", "3"], None)
        lines = [l for l in text.splitlines() if "giving up after waiting" in l]
        give_up = [e for e in ev if e.get("action") == "give_up"]
        check(rc == 1 and len(lines) == 1 and f"mounted at {fs}" in lines[0] and
              "a save needs" in lines[0] and not restarts(ev) and give_up and
              give_up[0]["mount_point"] == fs and give_up[0]["needed_bytes"] > 0 and
              [e["cleared"] for e in ev if e["event"] == "waited"] == [False],
              f"full for good: gave up after --storage-wait-s 3 in one line naming {fs} and "
              f"the space a save needs (exit {rc}): {lines}")
    finally:
        subprocess.run(["umount", fs])

    # The same fault at every start: the default --max-restarts 3, with backoff.
    out = os.path.join(WORK, "every-attempt")
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.monotonic()
    p = subprocess.run([PENTAD, "launch", "--", *train_cmd(out, ["train.inject_fault=kill:1:12"])],
                       env=dict(ENV, PENTAD_INJECT_EVERY_ATTEMPT="1"), capture_output=True,
                       text=True, timeout=300)
    ev = events(out)
    waits = [e for e in ev if e["event"] == "wait"]
    check(p.returncode == 1 and "failed 4 times in a row, more than --max-restarts 3" in p.stdout
          and len(restarts(ev)) == 3 and [w["why"] for w in waits] == ["backoff"] * 2 and
          1.5 <= waits[0]["seconds"] <= 2.5 and 3.0 <= waits[1]["seconds"] <= 5.0,
          f"a kill at every start: given up after 3 restarts ({time.monotonic() - t0:.0f} s), "
          f"waits {[round(w['seconds'], 2) for w in waits]} s in the log")

    if failures:
        print(f"{len(failures)} full-disk checks failed")
        sys.exit(1)
    print("a full disk costs at most one restart")


main()
