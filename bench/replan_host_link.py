#!/usr/bin/env python3
"""A host link slowed to a quarter of its rate, re-planned around (issue 48, part 2), on two
hosts over real links (scripts/hosts.sh: network namespaces, veth links capped with tc at
1 Gbit/s, Open MPI's TCP between them): 8 ranks of gpt-tiny, 4 a host, global batch 16.

1. Layouts measured with the link at a quarter (250 Mbit/s) from the start: the median step of
   steps 20..STEPS, each once.
2. `pentad launch --replan` (this machine's calibration) on dp 8, the link throttled to a
   quarter at step 60: when the slow link was named, when re-planned (in steps), the layout,
   and its median step after the resume against the best measured in 1.

Needs root with CAP_NET_ADMIN. usage: replan_host_link.py PENTAD RECIPE WORK_DIR [STEPS]
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
STEPS = int(sys.argv[4]) if len(sys.argv) > 4 else 300
HOSTS_SH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                        "hosts.sh")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive", OMPI_MCA_mpi_yield_when_idle="1",
           PENTAD_HOSTS=f"pentadb{os.getpid() % 100000}")
for key in ("PENTAD_MONITOR", "OMPI_MCA_btl", "OMPI_MCA_pml"):
    ENV.pop(key, None)
RATE, QUARTER, THROTTLE_AT = "1gbit", "250mbit", 60
COMMON = ["data.source=random", "train.eval_every=0", "train.threads=1", "train.seq_len=32",
          "train.log_every=10", "train.save_every=20", "train.global_batch=16",
          f"train.steps={STEPS}"]
CANDIDATES = {
    "dp8 mb2 ga1": ["parallel.dp=8", "train.micro_batch=2", "train.grad_accum=1"],
    "tp2 dp4 mb2 ga2": ["parallel.tp=2", "parallel.dp=4", "train.micro_batch=2",
                        "train.grad_accum=2"],
    "tp4 dp2 mb2 ga4": ["parallel.tp=4", "parallel.dp=2", "train.micro_batch=2",
                        "train.grad_accum=4"],
    "pp2 dp4 mb2 ga2": ["parallel.pp=2", "parallel.dp=4", "train.micro_batch=2",
                        "train.grad_accum=2"],
    "pp2 zb-h1 dp4 mb4 ga1 z1": ["parallel.pp=2", "parallel.pp_schedule=zb-h1", "parallel.dp=4",
                                 "parallel.zero=1", "train.micro_batch=4", "train.grad_accum=1"],
    "dp8 mb2 ga1 z1": ["parallel.dp=8", "parallel.zero=1", "train.micro_batch=2",
                       "train.grad_accum=1"],
}


def hosts(*args):
    return subprocess.run(["bash", HOSTS_SH, *args], env=ENV, timeout=60, check=True,
                          capture_output=True, text=True).stdout


def job(out, keys):
    state = hosts("state").strip()
    cmd = ["mpirun", "--hostfile", f"{state}/hostfile", "--mca", "plm_rsh_agent",
           f"{state}/agent", "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include",
           "eth0", "--mca", "oob_tcp_if_include", "eth0", "-np", "8", "--npernode", "4",
           PENTAD, "train", RECIPE]
    for o in COMMON + keys + [f"train.out_dir={out}"]:
        cmd += ["--set", o]
    return cmd


def step_seconds(out):
    last = {}
    for line in open(os.path.join(out, "metrics.jsonl")):
        r = json.loads(line)
        if "loss" in r and "seconds" in r:
            last[r["step"]] = r["seconds"]
    return last


def run(out, keys, launch=(), throttle_at=None):
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    log_path = os.path.join(out, "launch.log")
    cmd = ["bash", HOSTS_SH, "exec", "h0", PENTAD, "launch", *launch, "--", *job(out, keys)]
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, env=ENV, stdout=log, stderr=subprocess.STDOUT, cwd=WORK)
        throttled = False
        deadline = time.time() + 600
        while p.poll() is None and time.time() < deadline:
            if throttle_at and not throttled:
                steps = re.findall(r"step\s+(\d+)/", open(log_path).read())
                if steps and int(steps[-1]) >= throttle_at:
                    hosts("shape", "h1", QUARTER)
                    throttled = True
            time.sleep(0.05)
        if p.poll() is None:
            p.kill()
        return p.wait()


def main():
    os.makedirs(WORK, exist_ok=True)
    hosts("up", "2", RATE, "--ttl", "1800")
    try:
        hosts("shape", "h1", QUARTER)
        print(f"| layout | step s, host link at {QUARTER} |")
        print("|---|---|")
        measured = {}
        for name, keys in CANDIDATES.items():
            out = os.path.join(WORK, name.replace(" ", "_"))
            status = run(out, keys)
            s = step_seconds(out) if status == 0 else {}
            if s:
                measured[name] = statistics.median(v for k, v in s.items() if k >= 20)
            print(f"| {name} | " + (f"{measured[name]:.4f}" if name in measured else
                                    f"failed ({status})") + " |", flush=True)
        hosts("shape", "h1", RATE)
        out = os.path.join(WORK, "launch")
        status = run(out, CANDIDATES["dp8 mb2 ga1"], ["--replan"], THROTTLE_AT)
        print("\n".join(l for l in open(os.path.join(out, "launch.log")).read().splitlines()
                        if l.startswith("pentad launch:") and "monitor at" not in l
                        and "action: restart" not in l))
        events = [json.loads(l) for l in open(os.path.join(out, "events.jsonl"))]
        detection = next((e for e in events if e.get("event") == "detection"), None)
        replan = next((e for e in events if e.get("action") == "replan"), None)
        resumed = next((e for e in events if e.get("event") == "resumed"), None)
        if status or not (detection and replan and resumed):
            print(f"\nno re-plan to measure (status {status})")
            return 1
        s = step_seconds(out)
        after = statistics.median(v for k, v in s.items() if k >= resumed["resume_step"] + 20)
        best = min(measured, key=measured.get)
        print(f"\nnamed {detection['class']} {detection.get('host')}-{detection.get('peer_host')}; "
              f"re-planned {replan['t'] - detection['t']:.3f} s later "
              f"({(replan['t'] - detection['t']) / detection['median_step_s']:.2f} steps): "
              f"{replan['layout_before']} -> {replan.get('layout_after')}; its median step after "
              f"the resume {after:.4f} s, {after / measured[best]:.2f}x the best measured ({best}, "
              f"{measured[best]:.4f} s)")
    finally:
        subprocess.run(["bash", HOSTS_SH, "down"], env=ENV, timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
