#!/usr/bin/env python3
"""The job's own memory cgroup bounds the plan (core/cgroup.h), on a real cgroup.

Makes a child of this process's memory cgroup (v1 memory.limit_in_bytes or v2 memory.max)
with a 1000 MiB limit and runs pentad inside it: a plan of about 1.1 GiB (GPT-2 shape, 71M
parameters, AdamW in memory) is refused before any large allocation, naming the cgroup and
its file; the same plan with AdamW's state on NVMe (about 0.6 GiB) trains a step. Needs root
and a writable cgroup hierarchy; exits 77 (skipped) otherwise, saying why.

usage: cgroup_limit.py PENTAD RECIPE WORKDIR
"""
import errno
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

LIMIT = 1000 * 2**20
MODEL = ["model.d_model=768", "model.n_layer=10", "model.n_head=12", "train.steps=1",
         "train.micro_batch=2", "train.seq_len=64", "train.eval_every=0", "train.threads=1",
         "data.source=random"]


def skip(why):
    print(f"skipped: {why}")
    sys.exit(77)


def own_memory_cgroup():
    """(directory of this process's memory cgroup, the file that limits it)."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    for line in lines:  # v1: "N:memory:/path"
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory" + path), "memory.limit_in_bytes"
    for line in lines:  # v2: "0::/path", mounted at /sys/fs/cgroup (or .../unified)
        if line.startswith("0::"):
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                base = Path(root + line[3:])
                if (Path(root) / "cgroup.controllers").exists() and base.is_dir():
                    return base, "memory.max"
    return None, None


def remove_cgroup(child):
    """Removes the child cgroup; returns what still lives in it after 10 s ("" when gone).

    The kernel keeps a cgroup busy for a moment after its last process exits (io_uring
    workers, exiting threads), so rmdir is retried; processes are moved to the parent."""
    deadline = time.monotonic() + 10
    while True:
        try:
            child.rmdir()
            return ""
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
        pids = (child / "cgroup.procs").read_text().split()
        if time.monotonic() > deadline:
            names = []
            for pid in pids:
                try:
                    names.append(f"{pid} ({Path(f'/proc/{pid}/comm').read_text().strip()})")
                except OSError:
                    names.append(pid)
            if not names:  # the kernel's own state, not a process of pentad's
                print(f"note: {child} is empty yet still busy; left in place")
            return ", ".join(names)
        for pid in pids:
            try:
                (child.parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # exited meanwhile, or a kernel thread that cannot move
        time.sleep(0.1)


def main():
    pentad, recipe, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    if os.geteuid() != 0:
        skip("not root: no cgroup can be made")
    parent, limit_file = own_memory_cgroup()
    if parent is None:
        skip("no memory cgroup found in /proc/self/cgroup")
    child = parent / f"pentad-test-{os.getpid()}"
    try:
        child.mkdir()
        (child / limit_file).write_text(str(LIMIT))
    except OSError as e:
        skip(f"cannot make a memory cgroup under {parent}: {e}")
    shutil.rmtree(work, ignore_errors=True)
    (work / "offload").mkdir(parents=True)
    failures = []
    try:
        def run(overrides):
            # The shell moves itself into the child before it becomes pentad.
            cmd = ["sh", "-c", f'echo $$ > "{child}/cgroup.procs" && exec "$@"', "sh", pentad,
                   "train", recipe, *MODEL, f"train.out_dir={work}/run", *overrides]
            env = dict(os.environ, OMP_NUM_THREADS="1")
            return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)

        refused = run([])
        out = refused.stdout + refused.stderr
        ok = refused.returncode == 2 and "does not fit" in out and f"({limit_file})" in out \
            and child.name in out
        print(("ok   " if ok else "FAIL ") + f"a 1.1 GiB plan in a {LIMIT >> 20} MiB cgroup is "
              f"refused naming it (exit {refused.returncode})")
        if not ok:
            failures.append("refused")
            print(out[-2000:])
        fits = run(["parallel.offload=nvme", f"parallel.offload_path={work}/offload"])
        out = fits.stdout + fits.stderr
        ok = fits.returncode == 0 and "step     1/1" in out and child.name in out
        print(("ok   " if ok else "FAIL ") + "the same plan with AdamW's state on NVMe trains "
              f"inside it (exit {fits.returncode})")
        if not ok:
            failures.append("nvme")
            print(out[-2000:])
    finally:
        leftover = remove_cgroup(child)
    if leftover:
        print(f"FAIL processes still in {child} 10 s after pentad ended: {leftover}")
        failures.append("leftover")
    if failures:
        sys.exit(1)
    print("the job's cgroup bounds the plan")


if __name__ == "__main__":
    main()
