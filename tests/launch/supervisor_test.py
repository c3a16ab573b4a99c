#!/usr/bin/env python3
"""`pentad launch` against a fake job (tests/launch/fake_job.py): each fault is detected with
the right class and culprit within the latency bound, the ranks are asked for their traces,
the job is ended and restarted from its checkpoint, and events.jsonl records all of it; a
clean run sees no detection, nor does one whose rank's process is gone before its bye is
read; a job that fails every time is given up after --max-restarts, its restarts backing off
with each wait in the log, while one whose fault comes back only after progress is never given
up; the steps a restart redoes are counted from the ranks' last beats; a checkpoint directory
gone at the fault is waited for before the restart (and given up on, by name, after
--storage-wait-s); a refused job's decision is its last line.

usage: supervisor_test.py PENTAD WORK_DIR [CHECK...]  (CHECK: one function's name, e.g.
steps_redone; all of them by default)
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

PENTAD, WORK = sys.argv[1], sys.argv[2]
FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_job.py")
HANG_BOUND_S = 3.0  # threshold max(2 s floor, 5 x ~0.12 s steps) + a beat + a tick
DEAD_BOUND_S = 0.5  # a closed connection is seen at once; its last beat was <= 0.1 s before
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what, flush=True)


def launch(name, scenario, options=(), fake_options=(), timeout=120):
    out = os.path.join(WORK, name)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [PENTAD, "launch", *options, "--", sys.executable, FAKE, "--out", out,
           *fake_options, scenario]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    events_path = os.path.join(out, "events.jsonl")
    events = [json.loads(l) for l in open(events_path)] if os.path.exists(events_path) else []
    print(f"--- {name}: {scenario}, exit {p.returncode}, {time.monotonic() - t0:.1f} s\n"
          + "\n".join(l for l in p.stdout.splitlines() if l.startswith("pentad launch")),
          flush=True)
    return p, events, out


def of(events, kind, action=None):
    return [e for e in events if e["event"] == kind and (action is None or e["action"] == action)]


def recovered(name, scenario, cls, culprit, bound):
    """One fault on attempt 0, a clean attempt 1: detection, dump, kill, restart, resume."""
    p, events, out = launch(name, scenario)
    check(p.returncode == 0, f"{name}: exit {p.returncode}, not 0\n{p.stdout}\n{p.stderr}")
    det = of(events, "detection")
    check(len(det) == 1, f"{name}: {len(det)} detections, not 1")
    if not det:
        return
    d = det[0]
    check(d["class"] == cls and d["culprit"] == culprit,
          f"{name}: detected {d['class']} culprit {d['culprit']}, not {cls} culprit {culprit}")
    check(0 <= d["latency_s"] < bound, f"{name}: latency {d['latency_s']:.2f} s, bound {bound}")
    check(d["attempt"] == 0 and d["t"] > 0, f"{name}: detection {d}")
    actions = [e["action"] for e in of(events, "action")]
    check(actions == ["dump", "kill", "restart"], f"{name}: actions {actions}")
    check(all(e["seconds"] >= 0 for e in of(events, "action")), f"{name}: action timings")
    restart = of(events, "action", "restart")
    check(restart and restart[0]["command"][-2:] == ["--resume", "latest"],
          f"{name}: restart command {restart}")
    res = of(events, "resumed")
    check(len(res) == 1 and res[0]["attempt"] == 1 and res[0]["resume_step"] == 10 and
          res[0]["steps_lost"] >= 1 and 0 < res[0]["seconds_to_resume"] < 10,
          f"{name}: resumed {res}")
    check(of(events, "exit") == [e for e in events if e["event"] == "exit"] and
          events[-1]["event"] == "exit" and events[-1]["status"] == 0 and
          events[-1]["restarts"] == 1, f"{name}: exit event {events[-1:]}")
    # The live ranks were asked for their traces before the kill (a stopped one cannot answer).
    dumps = [f for f in os.listdir(out) if f.startswith("dump-") and f.endswith("attempt0.txt")]
    check(len(dumps) >= 2, f"{name}: trace dumps {dumps}")
    return d["latency_s"]


def clean():
    # 120 steps of about 0.12 s: several of the detector's windows (hang 2 s, slow 2 s)
    p, events, _ = launch("clean", "clean:120")
    check(p.returncode == 0, f"clean: exit {p.returncode}\n{p.stderr}")
    check(not of(events, "detection") and not of(events, "action"), f"clean: events {events}")
    check(events and events[-1] == {**events[-1], "event": "exit", "status": 0, "restarts": 0},
          f"clean: {events}")


def last_word():
    """A rank whose process is gone before its bye is read is not dead if the bye follows."""
    p, events, _ = launch("lastword", "lastword:2:0", fake_options=["--steps", "15"])
    check(p.returncode == 0 and not of(events, "detection") and not of(events, "action"),
          f"last word: exit {p.returncode}, events {events}")


def slow():
    p, events, _ = launch("slow", "slow:2:3")
    det = of(events, "detection")
    check(p.returncode == 0 and len(det) == 1 and det[0]["class"] == "non-comm slow" and
          det[0]["culprit"] == 2 and not of(events, "action"),
          f"slow: exit {p.returncode}, events {events}")
    return det[0]["latency_s"] if det else None


def slow_seen_at_the_end():
    """Slowness that arrives only with the bye (steps shorter than a beat) is still reported."""
    p, events, _ = launch("slow-late", "slow:1:3", fake_options=["--steps", "12", "--late-steps"])
    det = of(events, "detection")
    check(p.returncode == 0 and len(det) == 1 and det[0]["class"] == "non-comm slow" and
          det[0]["culprit"] == 1 and not of(events, "action"),
          f"slow seen at the end: exit {p.returncode}, events {events}")


def slow_restarts():
    p, events, _ = launch("slow-restart", "slow:1:3", ["--restart-on-slow"])
    det = of(events, "detection")
    check(p.returncode == 0 and det and det[0]["class"] == "non-comm slow" and
          events[-1]["restarts"] == 1, f"slow with --restart-on-slow: {events}")


def link_slow():
    p, events, _ = launch("link", "linkslow:1:3")
    det = of(events, "detection")
    check(p.returncode == 0 and len(det) == 1 and det[0]["class"] == "comm slow" and
          det[0]["culprit"] == [1, 3], f"link: exit {p.returncode}, events {events}")


def give_up():
    """The same fault at every start: restarts back off (0, then 0.4 s x 0.75-1.25), each wait
    in the log, and the job is given up after --max-restarts."""
    p, events, out = launch("give-up", "kill:0:3", ["--max-restarts", "2", "--backoff-s", "0.4"],
                            ["--every-attempt"])
    words = ("the job failed 3 times in a row, more than --max-restarts 2 (no attempt got 3 "
             "steps past step ")
    check(p.returncode == 1 and words in p.stdout, f"give-up: exit {p.returncode}\n{p.stdout}")
    check(len(of(events, "detection")) == 3 and of(events, "action", "give_up") and
          events[-1]["event"] == "exit" and events[-1]["status"] == 1,
          f"give-up: events {events}")
    waits = [e for e in events if e["event"] == "wait"]
    waited = [e for e in events if e["event"] == "waited"]
    restarts = of(events, "action", "restart")
    check(len(waits) == 1 and waits[0]["why"] == "backoff" and waits[0]["same_cause"] == 2 and
          0.3 <= waits[0]["seconds"] <= 0.5 and len(waited) == 1 and
          waited[0]["seconds"] >= waits[0]["seconds"] and waited[0]["cleared"] and
          [r["in_a_row"] for r in restarts] == [1, 2],
          f"give-up: the first restart at once, the second after a backoff: {events}")


def cleared():
    """A fault that comes back on every attempt, but only after the job got past where it
    failed before, never uses up --max-restarts 1: each such run clears the count (killed 25
    steps after its resume: at 25, 45, 65, 85; the steps a beat may not have shown, 10 at
    these 12 ms steps, count as reached)."""
    p, events, _ = launch("cleared", "killafter:1:25", ["--max-restarts", "1"],
                          ["--steps", "90", "--compute-s", "0.01"])
    check(p.returncode == 0 and events[-1]["restarts"] == 4 and
          len([e for e in events if e["event"] == "cleared"]) == 3 and
          not [e for e in events if e["event"] == "wait"],
          f"cleared: exit {p.returncode}, events {events}\n{p.stdout}")


def steps_redone():
    """Steps shorter than a beat: the steps redone are those the ranks had finished when the
    job was ended (rank 1 killed at step 27, the others blocked after it) less the step
    resumed from (20), not what the last beat before the detection said."""
    p, events, _ = launch("redone", "kill:1:27",
                          fake_options=["--compute-s", "0.004", "--steps", "80"])
    res = of(events, "resumed")
    check(p.returncode == 0 and len(res) == 1 and res[0]["resume_step"] == 20 and
          res[0]["reached_step"] == 27 and res[0]["steps_lost"] == 7 and
          "resumed at step 20 (7 steps redone: step 27 was reached" in p.stdout,
          f"steps redone: exit {p.returncode}, resumed {res}\n{p.stdout}")


def lost_directory():
    """The checkpoint directory vanishes with the fault (an unmounted share): the supervisor
    waits for it, saying so, and restarts once it is back; never back: it gives up by name."""
    out = os.path.abspath(os.path.join(WORK, "lost"))

    def put_back():  # 2.5 s after it went
        away = os.path.join(out, "ckpt.away")
        until = time.monotonic() + 60
        while not os.path.exists(away) and time.monotonic() < until:
            time.sleep(0.05)
        time.sleep(2.5)
        os.rename(away, os.path.join(out, "ckpt"))

    with ThreadPoolExecutor(max_workers=1) as helper:
        back = helper.submit(put_back)
        p, events, _ = launch("lost", "lose:2:14")
        back.result()
    waits = [e for e in events if e["event"] == "wait"]
    waited = [e for e in events if e["event"] == "waited"]
    res = of(events, "resumed")
    check(p.returncode == 0 and len(waits) == 1 and waits[0]["why"] == "checkpoint_dir" and
          len(waited) == 1 and waited[0]["cleared"] and waited[0]["seconds"] > 1.0 and
          len(res) == 1 and res[0]["resume_step"] == 10 and
          "waiting before restarting (up to --storage-wait-s 30): the checkpoint directory "
          f"{out}/ckpt is gone" in p.stdout,
          f"lost directory: exit {p.returncode}, events {events}\n{p.stdout}")
    p, events, _ = launch("lost-for-good", "lose:2:14", ["--storage-wait-s", "1"])
    line = [l for l in p.stdout.splitlines() if "giving up after waiting" in l]
    gone = os.path.abspath(os.path.join(WORK, "lost-for-good", "ckpt")) + " is gone"
    check(p.returncode == 1 and len(line) == 1 and gone in line[0]
          and not of(events, "action", "restart") and
          [e["cleared"] for e in events if e["event"] == "waited"] == [False],
          f"lost for good: exit {p.returncode}, events {events}\n{p.stdout}")


def stopped_by_signal():
    """SIGTERM to the supervisor ends the job with it."""
    out = os.path.join(WORK, "sigterm")
    shutil.rmtree(out, ignore_errors=True)
    p = subprocess.Popen([PENTAD, "launch", "--", sys.executable, FAKE, "--out", out,
                          "clean:400"], stdout=subprocess.PIPE, text=True)
    time.sleep(3)
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=20)
    events = [json.loads(l) for l in open(os.path.join(out, "events.jsonl"))]
    ps = subprocess.run(["pgrep", "-f", out], capture_output=True, text=True).stdout.split()
    check(rc == 128 + signal.SIGTERM and events[-1]["event"] == "exit" and not ps,
          f"sigterm: exit {rc}, events {events}, left {ps}")


def refused_jobs():
    """A job refused before its first step ends at once: no restart, no exclusion."""
    for name, scenario, words in [
            ("refused", "refuse:0:0", "refused before its first step: model.n_head = 5"),
            ("refused-early", "refuse:1:0", "refused before its first step (its ranks")]:
        p, events, out = launch(name, scenario, ["--exclude-culprit"], ["--every-attempt"])
        check(p.returncode == 2 and words in p.stdout and "not restarting" in p.stdout
              and not of(events, "action", "restart") and not of(events, "action", "exclude"),
              f"{name}: exit {p.returncode}\n{p.stdout}\nevents {events}")
        # The decision comes after the actions that end the job, not before them.
        lines = [l for l in p.stdout.splitlines() if l.startswith("pentad launch")]
        check("not restarting" in lines[-1] and
              (not events or events[-2]["event"] == "refused"),
              f"{name}: the decision is the last line\n{p.stdout}")


def refusals():
    cases = [(["launch"], "put its command after --"),
             (["launch", "--max-restarts", "x", "--", "true"], "--max-restarts takes a number"),
             (["launch", "--backoff-s", "-1", "--", "true"], "--backoff-s takes a number"),
             (["launch", "--storage-wait-s", "x", "--", "true"], "--storage-wait-s takes a"),
             (["launch", "--", "/no/such/launcher"], "cannot run '/no/such/launcher'")]
    for args, words in cases:
        p = subprocess.run([PENTAD, *args], capture_output=True, text=True, timeout=30)
        check(p.returncode == 2 and words in p.stderr, f"{args}: exit {p.returncode} {p.stderr}")


os.makedirs(WORK, exist_ok=True)
if sys.argv[3:]:
    for name in sys.argv[3:]:
        globals()[name]()
    print(f"{len(failures)} supervisor checks failed" if failures else "those checks passed")
    sys.exit(1 if failures else 0)
refusals()
# The scenarios mostly wait (beats, timeouts): six at once, the longest (clean) first.
with ThreadPoolExecutor(max_workers=6) as pool:
    first = pool.submit(clean)
    jobs = {"dead": pool.submit(recovered, "dead", "kill:1:12", "dead", 1, DEAD_BOUND_S),
            "non-comm hang": pool.submit(recovered, "hang", "hang:2:12", "non-comm hang", 2,
                                         HANG_BOUND_S),
            "comm hang": pool.submit(recovered, "commhang", "commhang:1:12", "comm hang", 1,
                                     HANG_BOUND_S),
            "stopped (SIGSTOP)": pool.submit(recovered, "stop", "stop:3:12", "non-comm hang",
                                             3, HANG_BOUND_S),
            "non-comm slow": pool.submit(slow)}
    others = [first] + [pool.submit(f) for f in (give_up, slow_restarts, slow_seen_at_the_end,
                                       link_slow, stopped_by_signal, last_word, refused_jobs,
                                       cleared, steps_redone, lost_directory)]
    latencies = {k: f.result() for k, f in jobs.items()}
    for f in others:
        f.result()
print("detection latencies (s): " +
      ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in latencies.items()))
if failures:
    print(f"{len(failures)} supervisor checks failed")
    sys.exit(1)
print("supervisor detects and recovers every scenario")
