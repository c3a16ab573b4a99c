#!/usr/bin/env python3
"""Faults of the wire on two hosts over real links (scripts/hosts.sh: network namespaces
joined by veth links through a bridge, capped with tc), under `pentad launch`: 8 ranks of
gpt-tiny, tp 2 inside each host and dp 4 across them, Open MPI's TCP between the hosts.

- probe: `pentad probe --quick` finds the two hosts' islands from TCP alone, and measures the
         link between them within 20% of the rate set;
- cut:   h1's link down at step 60 for longer than --link-wait-s: named "host unreachable"
         (h1, ranks 4-7), the job ended, restarted once the host answers again;
- flap:  h1's link down for 2 s: no data lost, the policy recorded (wait: if it is detected,
         the job goes on once the host is heard again, no restart);
- slow:  h1's link throttled to a tenth at step 60: named "comm slow" between h0 and h1,
         with the measured slowdown; not restarted (no --restart-on-slow);
- kill:  every process of h1 killed at step 60: named "host down" (h1), restarted.
- replan: the same under --replan: restarted on h0 alone (the hostfile without h1), on the
         planner's layout for the ranks that remain, from the survivors' state (h0 holds a
         replica of every shard): no step redone, the losses bitwise the reference's up to the
         resume and within 1e-5 for 20 steps after it.
Each run's losses, step for step, are bitwise an uninterrupted run's over the same hosts.
The detection times (from the fault to the named culprit) are printed and checked against
the goal of 10 s.

Needs root with CAP_NET_ADMIN (network namespaces): otherwise it says so in one line and
exits 77 (skipped). The hosts are removed on every way out (and by hosts.sh's own reaper).

usage: hosts_test.py PENTAD RECIPE WORK_DIR [CASE ...]   (default: every case)
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

PENTAD, RECIPE, WORK = (os.path.abspath(a) for a in sys.argv[1:4])
CASES = sys.argv[4:] or ["probe", "cut", "flap", "slow", "kill", "replan"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOSTS_SH = os.path.join(ROOT, "scripts", "hosts.sh")
PREFIX = f"pentadt{os.getpid() % 100000}"
RATE = "1gbit"
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive", OMPI_MCA_mpi_yield_when_idle="1",
           PENTAD_HOSTS=PREFIX)
for key in ("PENTAD_MONITOR", "OMPI_MCA_btl", "OMPI_MCA_pml"):
    ENV.pop(key, None)
STEPS = 300
FAULT_AT = 60
COMMON = ["data.source=random", "train.eval_every=0", "train.threads=1", "train.micro_batch=2",
          "train.seq_len=32", "train.log_every=50", "parallel.tp=2", "parallel.dp=4",
          f"train.steps={STEPS}", "train.save_every=20"]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def hosts(*args, timeout=60):
    return subprocess.run(["bash", HOSTS_SH, *args], env=ENV, timeout=timeout, check=True,
                          capture_output=True, text=True).stdout


def job(out):
    """mpirun across the hosts, as hosts.sh mpirun runs it, for `pentad launch -- ...`."""
    state = hosts("state").strip()
    cmd = ["mpirun", "--hostfile", f"{state}/hostfile", "--mca", "plm_rsh_agent",
           f"{state}/agent", "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include",
           "eth0", "--mca", "oob_tcp_if_include", "eth0", "-np", "8", "--npernode", "4",
           PENTAD, "train", RECIPE]
    for o in COMMON + [f"train.out_dir={out}"]:
        cmd += ["--set", o]
    return cmd


def losses(out):
    """step -> loss, the last run of each step (a resumed run repeats steps)."""
    got = {}
    path = os.path.join(out, "metrics.jsonl")
    for line in open(path) if os.path.exists(path) else []:
        r = json.loads(line)
        if "loss" in r and "eval_loss" not in r:
            got[r["step"]] = r["loss"]
    return got


def events(out):
    path = os.path.join(out, "events.jsonl")
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []


def step_reached(out):
    """The newest step rank 0 logged (metrics.jsonl holds every log_every-th step only, so
    the supervisor's beats are not at hand: read the launch log's step lines)."""
    path = os.path.join(out, "launch.log")
    steps = re.findall(r"step\s+(\d+)/", open(path).read()) if os.path.exists(path) else []
    return int(steps[-1]) if steps else 0


def launch(out, fault=None, extra=()):
    """Runs the job under pentad launch; `fault(t)` is called once step FAULT_AT is logged.
    Returns (exit status, the fault's time in seconds from the start, or None)."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    log = open(os.path.join(out, "launch.log"), "w")
    cmd = ["bash", HOSTS_SH, "exec", "h0", PENTAD, "launch", "--max-restarts", "2",
           "--backoff-s", "0.2", *extra, "--", *job(out)]
    started = time.time()  # the supervisor's clock (events' "t") starts within milliseconds
    p = subprocess.Popen(cmd, env=ENV, stdout=log, stderr=subprocess.STDOUT, cwd=WORK)
    fault_at = None
    deadline = time.time() + 240
    try:
        while p.poll() is None and time.time() < deadline:
            if fault and fault_at is None and step_reached(out) >= FAULT_AT:
                fault_at = time.time() - started
                fault(fault_at)
            time.sleep(0.02)
        if p.poll() is None:
            p.kill()
            check(False, f"{out}: the job did not end within 240 s")
        return p.wait(), fault_at
    finally:
        log.close()


def restarts(out):
    return sum(1 for e in events(out) if e.get("action") == "restart")


def detection(out):
    found = [e for e in events(out) if e.get("event") == "detection"]
    return found[0] if found else None


def same_losses(out, reference, what):
    got = losses(out)
    steps = sorted(reference)
    equal = [s for s in steps if got.get(s) == reference[s]]
    check(len(equal) == len(steps) and len(steps) >= STEPS // 50,
          f"{what}: {len(equal)} of {len(steps)} logged losses bitwise the uninterrupted run's"
          + ("" if len(equal) == len(steps) else
             f" (first differing step {next(s for s in steps if got.get(s) != reference[s])})"))


def main():
    if os.geteuid() != 0 or subprocess.run(["ip", "netns", "list"],
                                           capture_output=True).returncode != 0:
        print("hosts_test: needs root with CAP_NET_ADMIN (network namespaces); skipped")
        return 77
    os.makedirs(WORK, exist_ok=True)
    print(hosts("check").strip(), flush=True)
    hosts("up", "2", RATE, "--ttl", "900")
    try:
        status, _ = launch(os.path.join(WORK, "reference"))
        reference = losses(os.path.join(WORK, "reference"))
        check(status == 0 and max(reference, default=0) == STEPS,
              f"the uninterrupted run over the hosts finished ({len(reference)} losses)")
        for case in CASES:
            globals()["case_" + case](reference)
    finally:
        subprocess.run(["bash", HOSTS_SH, "down"], env=ENV, timeout=60)
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("the wire's faults are named and recovered with nothing lost")
    return 0


def named(out, fault_at, cls, culprit, what):
    d = detection(out)
    check(d is not None and d.get("class") == cls and (culprit is None or d.get("culprit") == culprit),
          f"{what}: detected as {cls} {culprit} ({d and d.get('class')} {d and d.get('culprit')}: "
          f"{d and d.get('reason')})")
    if d and fault_at is not None:
        seconds = d["t"] - fault_at
        print(f"     {what}: named {seconds:.1f} s after the fault", flush=True)
        check(seconds <= 10, f"{what}: named within 10 s of the fault ({seconds:.1f} s)")
    return d


def case_probe(reference):
    topology = os.path.join(WORK, "topology.json")
    state = hosts("state").strip()
    run = subprocess.run(["bash", HOSTS_SH, "mpirun", "-np", "8", "--npernode", "4", PENTAD,
                          "probe", "--quick", "-o", topology], env=ENV, timeout=300,
                         capture_output=True, text=True, cwd=WORK)
    print("\n".join("     " + l for l in run.stdout.splitlines() if not l.startswith("probe: ")
                    or "islands" in l), flush=True)
    check(run.returncode == 0, f"probe: ran over the hosts ({state})")
    if run.returncode != 0:
        print(run.stderr[-2000:])
        return
    t = json.load(open(topology))
    check(t["islands"] == [[0, 1, 2, 3], [4, 5, 6, 7]], f"probe: islands {t['islands']}")
    rate_gbs = 1.0 / 8  # RATE, 1 Gbit/s, in GB/s
    links = t.get("host_links", [])
    measured = links[0]["bandwidth_gbs"] if links else 0
    check(abs(measured - rate_gbs) <= 0.2 * rate_gbs,
          f"probe: the link between the hosts measured at {measured:.4g} GB/s, within 20% of "
          f"the {rate_gbs:.4g} GB/s set")


def case_cut(reference):
    out = os.path.join(WORK, "cut")
    down_s = 8

    def cut(t):
        hosts("cut", "h1")
        time.sleep(down_s)
        hosts("heal", "h1")

    status, fault_at = launch(out, cut, ["--link-wait-s", "3"])
    check(status == 0, f"cut: the job finished (status {status})")
    d = named(out, fault_at, "host unreachable", [4, 5, 6, 7], "cut")
    check(d is not None and d.get("host") == "h1", "cut: the host named is h1")
    check(restarts(out) >= 1, "cut: restarted")
    waits = [e for e in events(out) if e.get("event") == "wait" and e.get("why") == "host"]
    check(bool(waits), "cut: the restart waited for h1 to answer again")
    same_losses(out, reference, "cut")


def case_flap(reference):
    out = os.path.join(WORK, "flap")

    def flap(t):
        hosts("cut", "h1")
        time.sleep(2)
        hosts("heal", "h1")

    status, fault_at = launch(out, flap)
    check(status == 0, f"flap: the job finished (status {status})")
    kinds = [e.get("event") for e in events(out)]
    d = detection(out)
    waited = [e for e in events(out) if e.get("event") == "waited"]
    if d is None:
        print("     flap: not detected (TCP carried it through)", flush=True)
    else:
        check(d.get("class") == "host unreachable" and waited and waited[0].get("cleared"),
              f"flap: detected as host unreachable, waited for, heard again ({kinds})")
        if waited:
            print(f"     flap: named {d['t'] - fault_at:.1f} s after the link went down, heard "
                  f"again {waited[0]['seconds']:.1f} s later", flush=True)
    check(restarts(out) == 0, f"flap: no restart ({kinds})")
    same_losses(out, reference, "flap")


def case_slow(reference):
    out = os.path.join(WORK, "slow")
    status, fault_at = launch(out, lambda t: hosts("shape", "h1", "100mbit"))
    hosts("shape", "h1", RATE)
    check(status == 0, f"slow: the job finished (status {status})")
    d = named(out, fault_at, "comm slow", None, "slow")
    if d:
        check(sorted([d.get("host"), d.get("peer_host")]) == ["h0", "h1"],
              f"slow: the link named is between h0 and h1 ({d.get('reason')})")
    check(restarts(out) == 0, "slow: not restarted")
    seconds = {}
    for line in open(os.path.join(out, "metrics.jsonl")):
        r = json.loads(line)
        if "seconds" in r and "loss" in r:
            seconds[r["step"]] = r["seconds"]
    before = [v for k, v in seconds.items() if k < FAULT_AT]
    after = [v for k, v in seconds.items() if k > FAULT_AT + 20]
    if before and after:
        print(f"     slow: a step took {statistics.median(before) * 1e3:.1f} ms before the throttle, "
              f"{statistics.median(after) * 1e3:.1f} ms after "
              f"({statistics.median(after) / statistics.median(before):.1f}x)", flush=True)
    same_losses(out, reference, "slow")


def case_kill(reference):
    out = os.path.join(WORK, "kill")
    status, fault_at = launch(out, lambda t: hosts("kill", "h1"))
    check(status == 0, f"kill: the job finished (status {status})")
    d = named(out, fault_at, "host down", [4, 5, 6, 7], "kill")
    check(d is not None and d.get("host") == "h1", "kill: the host named is h1")
    same_losses(out, reference, "kill")


def case_replan(reference):
    out = os.path.join(WORK, "replan")
    status, fault_at = launch(out, lambda t: hosts("kill", "h1"),
                              ["--replan", "--cluster", "dgx-h100"])
    check(status == 0, f"replan: the job finished (status {status})")
    d = named(out, fault_at, "host down", [4, 5, 6, 7], "replan")
    check(d is not None and d.get("host") == "h1", "replan: the host named is h1")
    ev = events(out)
    restart = next((e for e in ev if e.get("action") == "restart"), {})
    command = restart.get("command", [])
    check(any(a.endswith("hostfile.without-h1") for a in command) and
          int(command[command.index("-np") + 1]) <= 4 if "-np" in command else False,
          f"replan: restarted without h1, on at most its 4 ranks ({' '.join(command[:8])} ...)")
    resumed = next((e for e in ev if e.get("event") == "resumed"), {})
    check(resumed.get("steps_lost") == 0,
          f"replan: resumed from the survivors' state at step {resumed.get('resume_step')}, "
          f"{resumed.get('steps_lost')} steps redone")
    # Another layout sums in another order: within 1e-5 for 20 steps after the resume (here,
    # at the peak learning rate, the two runs part ways some 40 steps on, as the soak in
    # bench/RESULTS.md found two layouts do), bitwise before it.
    got, at = losses(out), resumed.get("resume_step", 0)
    worst = max((abs(got[s] - reference[s]) / abs(reference[s])
                 for s in range(at + 1, at + 21) if s in got and s in reference), default=1.0)
    check(sorted(got) == sorted(reference) and all(got[s] == reference[s] for s in range(1, at + 1))
          and worst <= 1e-5,
          f"replan: every loss bitwise the uninterrupted run's up to the resume, within 1e-5 for "
          f"20 steps after it (worst {worst:.2e})")


if __name__ == "__main__":
    sys.exit(main())
