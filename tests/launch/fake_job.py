#!/usr/bin/env python3
"""A fake MPI job for `pentad launch` (tests/launch/supervisor_test.py): no MPI, no model.

It forks N fake ranks that speak the monitor protocol of launch/supervisor.h to
PENTAD_MONITOR: a hello, a beat every 100 ms from a thread of their own, a bye. Each step
computes ~0.1 s (a sleep; --compute-s) and ends in a shared collective (a barrier) that every
rank enters, reported as phase "wait" on comm "dp", seq = the step. Every 10 steps rank 0
commits a "checkpoint" (out/fake-ckpt, and out/ckpt/step-<8 digits>/manifest.json, the
directory the hello names as its ckpt_dirs); `--resume latest` starts from it, as pentad
train would.

Scenarios (on attempt >= 1 the job runs clean unless --every-attempt):
  clean:N         N steps, then bye "done"
  kill:R:S        rank R exits abruptly at step S; the others block in the collective
  killafter:R:K   rank R exits abruptly K steps after the step it resumed from (every attempt)
  lose:R:S        as kill, but first rank R renames out/ckpt away (an unmounted share) to
                  out/ckpt.away, which the test puts back
  hang:R:S        rank R stops stepping at step S but keeps beating in phase compute
  commhang:R:S    rank R enters another collective (comm "tp") at step S and stays there
  stop:R:S        rank R SIGSTOPs itself at step S (silent, connection open)
  slow:R:K        rank R computes K times longer every step; the others wait for it
  linkslow:A:B    beats carry a p2p latency matrix in which link A-B is 5x slower
  lastword:R:0    rank R's process exits at the end before its bye, which a child holding its
                  socket sends 0.2 s later (a clean end whose last message is still on its
                  way when the process is gone); the job exits 1 s after its ranks
  refuse:0:0      every rank says hello, then bye "refused" (an error before the first
                  step, as pentad train's ranks report a refused recipe), and exits 2
  refuse:1:0      no rank connects: the job exits 2 at once (a refusal before the mesh)
--late-steps: the beats carry no progress; the last one, sent with the bye just after the
job's own exit, carries every step (a run whose steps are shorter than a beat).
"""
import argparse
import json
import multiprocessing
import os
import random
import signal
import socket
import sys
import threading
import time

BEAT_S = 0.1
COMPUTE_S = 0.1


def rank_main(rank, args, barrier, finished, attempt, resume_step, misbehave):
    kind, a, b = misbehave if misbehave else ("clean", 0, 0)
    host, port = os.environ["PENTAD_MONITOR"].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    send_lock = threading.Lock()
    state_lock = threading.Lock()
    start = time.monotonic()
    state = {"step": resume_step, "phase": "other", "step_seconds": 0.0, "wait_seconds": 0.0,
             "ckpt_step": resume_step if resume_step > 0 else -1, "wait": None}

    def send(msg):
        with send_lock:
            sock.sendall((json.dumps(msg) + "\n").encode())

    def on_dump(signum, frame):  # the supervisor asks for the communication trace
        with open(os.path.join(args.out, f"dump-rank{rank}-attempt{attempt}.txt"), "w") as f:
            f.write(json.dumps(state) + "\n")

    signal.signal(signal.SIGUSR1, on_dump)
    send({"type": "hello", "rank": rank, "world": args.ranks, "pid": os.getpid(),
          "host": socket.gethostname(), "out_dir": args.out, "attempt": attempt,
          "resume_step": resume_step,
          "ckpt_dirs": [os.path.abspath(os.path.join(args.out, "ckpt"))]})

    def beats():
        while True:
            now = time.monotonic()
            with state_lock:
                msg = {"type": "beat", "rank": rank, "t": now - start, "step": state["step"],
                       "phase": state["phase"], "step_seconds": state["step_seconds"],
                       "wait_seconds": state["wait_seconds"], "ckpt_step": state["ckpt_step"]}
                if args.late_steps:  # no progress until the last beat
                    msg.update(step=resume_step, step_seconds=0.0, wait_seconds=0.0)
                if state["wait"]:
                    w = dict(state["wait"])
                    w["since_s"] = now - w.pop("entered")
                    msg["wait"] = w
            if kind == "linkslow":
                msg["p2p"] = [[p, 0.05 if {rank, p} == {a, b} else 0.01]
                              for p in range(args.ranks) if p != rank]
            try:
                send(msg)
            except OSError:
                return
            time.sleep(BEAT_S)

    if kind == "refuse":  # every attempt: what is refused is refused again
        send({"type": "bye", "rank": rank, "status": "refused",
              "message": "model.n_head = 5 does not divide parallel.tp = 2"})
        sock.close()
        os._exit(2)
    threading.Thread(target=beats, daemon=True).start()

    def enter_wait(comm, seq, members):
        with state_lock:
            state["phase"] = "wait"
            state["wait"] = {"comm": comm, "kind": "all_reduce", "seq": seq,
                             "entered": time.monotonic(), "members": members}

    everyone = list(range(args.ranks))
    recent = []  # [step, seconds, wait seconds] of every step, for --late-steps
    for step in range(resume_step, args.steps):
        t0 = time.monotonic()
        with state_lock:
            state["phase"] = "compute"
        bad_step = misbehave and rank == a and step == b
        if kind == "lose" and bad_step:
            os.rename(os.path.join(args.out, "ckpt"), os.path.join(args.out, "ckpt.away"))
        if kind in ("kill", "lose") and bad_step:
            os._exit(1)
        if kind == "killafter" and rank == a and step == resume_step + b:
            os._exit(1)
        if kind == "stop" and bad_step:
            os.kill(os.getpid(), signal.SIGSTOP)
        compute = args.compute_s * (1 + random.uniform(0, 0.3))
        if kind == "slow" and rank == a:
            compute *= b
        time.sleep(compute)
        if kind == "hang" and bad_step:
            while True:
                time.sleep(1)
        if kind == "commhang" and bad_step:
            time.sleep(0.3)  # it arrives after the others are already blocked in "dp"
            enter_wait("tp", 0, [rank, (rank + 1) % args.ranks])
            while True:
                time.sleep(1)
        entered = time.monotonic()
        enter_wait("dp", step, everyone)
        barrier.wait()
        done = time.monotonic()
        with state_lock:
            state.update(step=step + 1, phase="other", wait=None, step_seconds=done - t0,
                         wait_seconds=done - entered)
            if (step + 1) % 10 == 0:
                state["ckpt_step"] = step + 1
            recent.append([step + 1, done - t0, done - entered])
        if (step + 1) % 10 == 0 and rank == 0:
            tmp = os.path.join(args.out, "fake-ckpt.tmp")
            with open(tmp, "w") as f:
                f.write(str(step + 1))
            os.replace(tmp, os.path.join(args.out, "fake-ckpt"))
            step_dir = os.path.join(args.out, "ckpt", f"step-{step + 1:08d}")
            os.makedirs(step_dir, exist_ok=True)
            with open(os.path.join(step_dir, "manifest.json"), "w") as f:
                f.write("{}")
    if args.late_steps:  # every step at once, just before the bye, after the job's exit
        barrier.wait()
        if rank == 0:
            finished.set()
        time.sleep(0.3)
        with state_lock:
            send({"type": "beat", "rank": rank, "t": time.monotonic() - start,
                  "step": state["step"], "phase": "other", "ckpt_step": state["ckpt_step"],
                  "recent": recent})
    if kind == "lastword" and rank == a and os.fork() != 0:
        os._exit(0)  # the parent: gone first; the child says its bye
    if kind == "lastword" and rank == a:
        time.sleep(0.2)
    send({"type": "bye", "rank": rank, "status": "done", "message": ""})
    sock.close()
    os._exit(0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("scenario")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", default="runs/fake")
    p.add_argument("--every-attempt", action="store_true")
    p.add_argument("--compute-s", type=float, default=COMPUTE_S, help="seconds a step computes")
    p.add_argument("--resume", default="")
    p.add_argument("--late-steps", action="store_true",
                   help="beats carry no progress; the last one, before the bye, every step")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    attempt = int(os.environ.get("PENTAD_LAUNCH_ATTEMPT", "0"))

    kind, *numbers = args.scenario.split(":")
    numbers = [int(x) for x in numbers]
    misbehave = None
    if kind == "clean":
        args.steps = numbers[0] if numbers else args.steps
    elif attempt == 0 or args.every_attempt or kind == "killafter":
        misbehave = (kind, numbers[0], numbers[1])
    resume_step = 0
    if args.resume == "latest" and os.path.exists(os.path.join(args.out, "fake-ckpt")):
        resume_step = int(open(os.path.join(args.out, "fake-ckpt")).read())
    print(f"fake job: attempt {attempt}, {args.ranks} ranks, {args.scenario}, from step "
          f"{resume_step}", flush=True)
    if misbehave and misbehave[:2] == ("refuse", 1):
        sys.exit(2)

    barrier = multiprocessing.get_context("fork").Barrier(args.ranks)
    finished = multiprocessing.get_context("fork").Event()
    children = []
    for rank in range(args.ranks):
        pid = os.fork()
        if pid == 0:
            try:
                rank_main(rank, args, barrier, finished, attempt, resume_step, misbehave)
            finally:
                os._exit(3)
        children.append(pid)
    if args.late_steps:  # the job ends as the ranks finish, before their last messages
        finished.wait()
        sys.exit(0)
    # Like a launcher that does not notice a dead rank: wait for every one.
    failed = 0
    for pid in children:
        _, status = os.waitpid(pid, 0)
        failed += status != 0
    if misbehave and misbehave[0] == "lastword":
        time.sleep(1.0)
    refused = misbehave and misbehave[0] == "refuse"
    sys.exit((2 if refused else 1) if failed else 0)


if __name__ == "__main__":
    main()
