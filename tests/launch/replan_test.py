#!/usr/bin/env python3
"""`pentad launch --replan` end to end (issue 48): 8 ranks of gpt-tiny as tp 2 x pp 2 x dp 2
(global batch 8 sequences), rank 5 killed at step 20; the supervisor names it, re-plans for
the 7 ranks that remain (planned for the dgx-h100 preset, so that the choice does not depend
on this machine's calibration), and restarts on that layout from the newest checkpoint,
resharded on load. Checks: the events record the old and new layouts, the new one differs
from the old beyond dp, the global batch is kept, the predicted and then the measured step
are logged; every step's loss is there once, those before the resume bitwise the
uninterrupted run's and every one within 1e-5 relative of it (the same samples in the same
order, summed in another layout's order).

Then a slow link: 4 ranks of dp 4 (a ring through the link 1-2), that link 20 ms a send slower
from step 5 (and again after the restart: it stays slow), 200 steps. The supervisor names it, re-plans the
same 4 ranks with the link slowed and restarts on a layout in which ranks 1 and 2 share no group;
the losses as above. With --replan-gain too high to pay off, it stays and says why.

usage: replan_test.py PENTAD RECIPE WORK_DIR
"""
import json
import os
import shutil
import subprocess
import sys

PENTAD, RECIPE, WORK = (os.path.abspath(a) for a in sys.argv[1:4])
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1")
ENV.pop("PENTAD_MONITOR", None)
ENV.pop("PENTAD_INJECT_EVERY_ATTEMPT", None)
STEPS = 40
COMMON = ["train.eval_every=0", "train.threads=1", "data.source=random", "train.micro_batch=2",
          "train.grad_accum=2", "train.seq_len=32", "train.log_every=100", "train.save_every=5",
          "parallel.tp=2", "parallel.pp=2", "parallel.dp=2", f"train.steps={STEPS}"]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def train_cmd(out, extra=(), ranks=8, common=COMMON):
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), PENTAD, "train", RECIPE]
    for o in common + list(extra) + [f"train.out_dir={out}"]:
        cmd += ["--set", o]
    return cmd


def losses(out):
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r and "eval_loss" not in r]


def continues(out, reference, resume):
    last = {}
    for step, loss in losses(out):  # the resumed run's steps replace the first attempt's
        last[step] = loss
    check(sorted(last) == sorted(reference), f"every step 1..{max(reference)} has a loss")
    before = [s for s in range(1, resume + 1) if last.get(s) != reference[s]]
    check(not before, f"the steps up to the resume bitwise the uninterrupted run's ({before[:3]})")
    worst = max(abs(last[s] - reference[s]) / abs(reference[s]) for s in last if s in reference)
    check(worst <= 1e-5, f"every loss within 1e-5 relative of the uninterrupted run's "
                         f"(worst {worst:.2e})")


def slow_link():
    # 200 steps: the saving (the slow steps a re-plan spares) beats twice a restart's cost
    # even when a loaded machine starts the job slowly; the run that stays stops at 40.
    common = [o for o in COMMON if not o.startswith(("parallel.", "train.steps"))]
    common += ["parallel.dp=4", "train.steps=200"]
    ref = os.path.join(WORK, "slow-reference")
    p = subprocess.run(train_cmd(ref, ranks=4, common=common), env=ENV, capture_output=True,
                       text=True, timeout=300)
    check(p.returncode == 0, "the uninterrupted 4-rank run finished")
    if p.returncode:
        print(p.stdout[-2000:], p.stderr[-2000:])
        return
    reference = dict(losses(ref))
    env = dict(ENV, PENTAD_INJECT_EVERY_ATTEMPT="1")
    for gain in ("2", "1e5"):
        out = os.path.join(WORK, f"slow-gain-{gain}")
        stop = [] if gain == "2" else ["train.stop_at=40"]
        # The run that stays trains 35 slowed steps: under CI's load rank 0 was once held 2 s
        # outside any collective, likely on its checkpoint's disk work (given longer than a
        # hang since, docs/faults.md); the 5 s floor keeps this case about the link.
        p = subprocess.run([PENTAD, "launch", "--replan", "--cluster", "dgx-h100", "--replan-gain",
                            gain, "--hang-floor-s", "5", "--",
                            *train_cmd(out, ["train.inject_fault=slowlink:1:2:5:20"] + stop, 4,
                                       common)],
                           env=env, capture_output=True, text=True, timeout=300)
        print("\n".join(l for l in p.stdout.splitlines() if l.startswith("pentad launch")))
        check(p.returncode == 0, f"--replan-gain {gain}: the job finished (status {p.returncode})")
        events = [json.loads(l) for l in open(os.path.join(out, "events.jsonl"))]
        # The first attempt's: on the re-planned pp 2 x dp 2 the pipeline link 0-2 may read
        # "slow" by the nature of its small transfers, and is then stayed with (docs/faults.md).
        slow = [e for e in events if e["event"] == "detection" and e.get("class") == "comm slow"
                and e.get("attempt", 0) == 0]
        check(len(slow) == 1 and slow[0].get("culprit") == [1, 2],
              f"the link 1-2 named slow once ({[(e['class'], e['culprit']) for e in slow]})")
        later = [e for e in events if e.get("action") == "replan" and e.get("attempt", 0) > 0]
        check(all("stayed" in e or "refused" in e for e in later),
              f"no re-plan after the restart ({[e.get('stayed') for e in later]})")
        replan = next((e for e in events if e.get("action") == "replan"), {})
        restarts = [e for e in events if e.get("action") == "restart"]
        if gain != "2":
            check("stayed" in replan and "--replan-gain" in replan["stayed"] and not restarts,
                  f"too little to gain: no restart, and why ({replan.get('stayed')})")
            got = dict(losses(out))
            check(sorted(got) == list(range(1, 41)) and all(got[s] == reference[s] for s in got),
                  "every loss bitwise the uninterrupted run's")
            continue
        check(replan.get("cause") == "slow link" and replan.get("ranks_after") == 4 and
              replan.get("layout_after") != replan.get("layout_before") and
              replan.get("saved_s", 0) >= 2 * replan.get("restart_cost_s", 1e9),
              f"re-planned around it: {replan.get('layout_before')} -> "
              f"{replan.get('layout_after')}, saving {replan.get('saved_s')} s against "
              f"{replan.get('restart_cost_s')} s")
        command = restarts[0]["command"] if len(restarts) == 1 else []

        def last_set(key):
            values = [a.split("=", 1)[1] for a in command if a.startswith(key + "=")]
            return int(values[-1]) if values else 1

        tp, cp, dp = (last_set(f"parallel.{k}") for k in ("tp", "cp", "dp"))

        def coords(rank):
            return (rank % tp, rank // tp % cp, rank // (tp * cp) % dp, rank // (tp * cp * dp))

        check(len(restarts) == 1 and command[command.index("-np") + 1] == "4" and
              sum(a != b for a, b in zip(coords(1), coords(2))) >= 2,
              f"one restart, on 4 ranks, ranks 1 and 2 in no group together "
              f"({coords(1)} and {coords(2)})")
        resumed = next((e for e in events if e["event"] == "resumed"), {})
        continues(out, reference, resumed.get("resume_step", -1))


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    ref = os.path.join(WORK, "reference")
    p = subprocess.run(train_cmd(ref), env=ENV, capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, "the uninterrupted 8-rank run finished")
    if p.returncode:
        print(p.stdout[-2000:], p.stderr[-2000:])
        return 1
    reference = dict(losses(ref))

    out = os.path.join(WORK, "replan")
    p = subprocess.run([PENTAD, "launch", "--replan", "--cluster", "dgx-h100", "--",
                        *train_cmd(out, ["train.inject_fault=kill:5:20"])],
                       env=ENV, capture_output=True, text=True, timeout=300)
    print("\n".join(l for l in p.stdout.splitlines() if l.startswith("pentad launch")))
    check(p.returncode == 0, f"the job finished under pentad launch --replan (status {p.returncode})")
    events = [json.loads(l) for l in open(os.path.join(out, "events.jsonl"))]
    detection = next((e for e in events if e["event"] == "detection"), {})
    check(detection.get("class") == "dead" and detection.get("culprit") == 5,
          f"rank 5 named dead ({detection.get('class')} {detection.get('culprit')})")
    replan = next((e for e in events if e.get("action") == "replan"), {})
    restart = next((e for e in events if e.get("action") == "restart"), {})
    command = restart.get("command", [])

    def last_set(key):
        values = [a.split("=", 1)[1] for a in command if a.startswith(key + "=")]
        return values[-1] if values else None

    tp, pp, dp = (int(last_set(f"parallel.{k}") or 0) for k in ("tp", "pp", "dp"))
    check(replan.get("ranks_before") == 8 and 1 <= replan.get("ranks_after", 0) <= 7 and
          command[command.index("-np") + 1] == str(replan.get("ranks_after")),
          f"re-planned from 8 ranks to {replan.get('ranks_after')} (-np in the restart)")
    check((tp, pp) != (2, 2) and tp * pp * dp == replan.get("ranks_after"),
          f"the layout changed beyond dp: {replan.get('layout_before')} -> "
          f"{replan.get('layout_after')} (tp {tp} pp {pp} dp {dp})")
    check(replan.get("global_batch") == 8 and last_set("train.global_batch") == "8",
          "the global batch of 8 sequences kept")
    check(replan.get("predicted_step_s_after", 0) > 0 and
          any(e["event"] == "measured" for e in events),
          "the new layout's predicted step logged, then its measured one")
    resumed = next((e for e in events if e["event"] == "resumed"), {})
    resume = resumed.get("resume_step", -1)
    check(0 < resume <= 20, f"resumed from the checkpoint at step {resume}")

    continues(out, reference, resume)
    slow_link()
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("the job re-planned for the ranks that remain and trained on, and around a slow link")
    return 0


if __name__ == "__main__":
    sys.exit(main())
