#!/usr/bin/env python3
"""`srun --mpi=pmix pentad train` trains like `mpirun`, on a one-node Slurm made for the test.

Writes a slurm.conf in a temporary directory (auth/none, this user as SlurmUser, free ports,
state and spool under the directory, proctrack/linuxproc, task/none, MpiDefault=pmix), starts
slurmctld and slurmd in the foreground as children, waits for the node to be idle, then:
  1. trains gpt-tiny as dp2 x tp2 on 4 ranks with `srun -n 4 --mpi=pmix` and with
     `mpirun -np 4`: every step's loss and gradient norm must be the same (same layout, same
     collectives: bitwise), and under srun the ranks must find each other on one machine
     (launch/rank.h: the log's "shared by 4 ranks");
  2. starts it with `srun --mpi=none`: refused once, naming the fix, before MPI_Init;
  3. submits scripts/slurm_train.sbatch twice, its ranks started by srun and by mpirun:
     `pentad launch` inside the allocation must see every rank finish, and each job must
     train the same losses.
Then stops the daemons and removes the directory. Exits 77 (skipped), saying why, when it
cannot run: not root (slurmd starts job steps as their user), Slurm or mpirun not installed.

usage: slurm_srun.py PENTAD RECIPE
"""
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANKS = 4
SBATCH = str(Path(__file__).resolve().parents[2] / "scripts" / "slurm_train.sbatch")
TRAIN = ["--set", "parallel.dp=2", "--set", "parallel.tp=2", "--set", "train.steps=4",
         "--set", "train.seq_len=32", "--set", "train.eval_every=0", "--set",
         "train.threads=0", "--set", "data.source=random"]


def skip(why):
    print(f"skipped: {why}")
    sys.exit(77)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_conf(tmp, node):
    # Slurm finds its node by the short host name; NodeAddr keeps all traffic on loopback.
    # CPUs as this machine has, so slurmd registers without a mismatch; jobs ask for more
    # ranks than that with --overcommit.
    conf = f"""ClusterName=pentadtest
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/none
CredType=cred/none
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd.pid
SlurmctldLogFile={tmp}/slurmctld.log
SlurmdLogFile={tmp}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmix
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    (tmp / "state").mkdir()
    (tmp / "spool").mkdir()
    (tmp / "slurm.conf").write_text(conf)
    return tmp / "slurm.conf"


def losses(out_dir):
    rows = [json.loads(l) for l in (out_dir / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in l]
    return [(r["step"], r["loss"], r["grad_norm"]) for r in rows]


def run(cmd, env, timeout_s=60):
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    return proc, time.monotonic() - t0


def submit(args, env):
    """Submits a batch job: (its id, or "" and why not)."""
    sub = subprocess.run(["sbatch", "--parsable", *args], env=env, capture_output=True,
                         text=True)
    if sub.returncode != 0:
        return "", f"sbatch failed ({sub.returncode}): {sub.stderr.strip()}"
    return sub.stdout.strip().split(";")[0], ""


def wait_job(job_id, env, t0, timeout_s=60):
    """Waits for a batch job to end: ("STATE EXIT:SIGNAL", seconds since t0). Polls
    scontrol, since `sbatch --wait` checks only every few seconds."""
    while time.monotonic() - t0 < timeout_s:
        show = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env,
                              capture_output=True, text=True).stdout
        fields = dict(f.split("=", 1) for f in show.split() if "=" in f)
        if fields.get("JobState") not in (None, "PENDING", "RUNNING", "CONFIGURING",
                                          "COMPLETING"):
            return f"{fields['JobState']} {fields.get('ExitCode')}", time.monotonic() - t0
        time.sleep(0.1)
    subprocess.run(["scancel", job_id], env=env)
    return f"TIMEOUT after {timeout_s} s", time.monotonic() - t0


def wait_idle(env, daemons, timeout_s=20):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name, d in daemons.items():
            if d.poll() is not None:
                return f"{name} exited with {d.returncode}"
        state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                               text=True).stdout.strip()
        if state == "idle":
            return ""
        time.sleep(0.2)
    return f"the node is not idle after {timeout_s} s (sinfo: {state!r})"


def stop(daemons):
    for d in daemons.values():
        if d.poll() is None:
            os.killpg(d.pid, signal.SIGTERM)
    for d in daemons.values():
        try:
            d.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(d.pid, signal.SIGKILL)
            d.wait()
    # slurmctld's slurmscriptd and any slurmstepd share the daemons' process groups.
    for d in daemons.values():
        try:
            os.killpg(d.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def become_subreaper():
    """slurmstepd daemonises (forks away from slurmd): as a subreaper this process inherits
    each one, so it can wait for them and none is left to an init that may not reap."""
    PR_SET_CHILD_SUBREAPER = 36
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_orphans(timeout_s=5.0):
    """Waits for the inherited step daemons to exit (SIGTERM, then SIGKILL after half the
    time); returns those that would not go."""
    deadline = time.monotonic() + timeout_s
    sig = signal.SIGTERM
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            return []
        children = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and \
                        int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                    children.append(int(proc.name))
            except (OSError, IndexError, ValueError):
                pass
        if not children:
            return []
        if time.monotonic() > deadline:
            return children
        if time.monotonic() > deadline - timeout_s / 2:
            sig = signal.SIGKILL
        for pid in children:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def leftovers(tmp):
    """Processes still holding the test's slurm.conf in their environment or arguments."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if str(tmp).encode() in (proc / "environ").read_bytes() + \
                    (proc / "cmdline").read_bytes():
                found.append(f"{proc.name} ({(proc / 'comm').read_text().strip()})")
        except OSError:
            pass
    return found


def check(failures, ok, what, detail=""):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)
        if detail:
            print(detail[-3000:])


def main():
    pentad, recipe = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if os.geteuid() != 0:
        skip("not root: slurmd runs job steps as their user and needs root to do so")
    for tool in ("slurmctld", "slurmd", "srun", "sbatch", "scontrol", "sinfo", "mpirun"):
        if not shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin"):
            skip(f"{tool} not found (Debian: apt-get install slurm-wlm openmpi-bin; "
                 "scripts/setup.sh installs them)")
    become_subreaper()
    tmp = Path(tempfile.mkdtemp(prefix="pentad-slurm-"))
    conf = write_conf(tmp, socket.gethostname().split(".")[0])
    # No SLURM_* from an outer allocation: srun would try to join its job.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(SLURM_CONF=str(conf), OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PATH=env.get("PATH", "") + ":/usr/sbin")
    daemons = {}
    failures = []
    t_start = time.monotonic()
    try:
        for name in ("slurmctld", "slurmd"):
            args = [name, "-D"] + (["-i"] if name == "slurmctld" else [])
            daemons[name] = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL,
                                             stderr=open(tmp / f"{name}.err", "w"),
                                             start_new_session=True)
        why = wait_idle(env, daemons)
        if why:
            logs = "".join((tmp / f).read_text()[-1500:] for f in
                           ("slurmctld.err", "slurmd.err", "slurmctld.log", "slurmd.log")
                           if (tmp / f).exists())
            check(failures, False, f"a one-node Slurm starts: {why}", logs)
            return 1
        print(f"ok   slurmctld and slurmd up, node idle after {time.monotonic() - t_start:.1f} s")

        def train(launcher, name):
            out = tmp / name
            proc, seconds = run(launcher + [pentad, "train", recipe, *TRAIN, "--set",
                                            f"train.out_dir={out}"], env)
            return proc, seconds, out

        srun = ["srun", "-n", str(RANKS), "--overcommit", "--mpi=pmix"]
        by_srun, s_srun, out_srun = train(srun, "srun")
        log = by_srun.stdout + by_srun.stderr
        check(failures, by_srun.returncode == 0,
              f"srun -n {RANKS} --mpi=pmix trains dp2 x tp2 ({s_srun:.1f} s)", log)
        check(failures, f"shared by {RANKS} ranks on this machine" in log,
              f"under srun the ranks find each other on one machine ({RANKS} share it)", log)
        by_mpirun, s_mpirun, out_mpirun = train(["mpirun", "--oversubscribe", "-np", str(RANKS)],
                                                "mpirun")
        check(failures, by_mpirun.returncode == 0,
              f"mpirun -np {RANKS} trains dp2 x tp2 ({s_mpirun:.1f} s)",
              by_mpirun.stdout + by_mpirun.stderr)
        if failures:
            return 1
        want = losses(out_mpirun)
        got = losses(out_srun)
        check(failures, len(want) == 4 and got == want,
              f"srun's losses and gradient norms equal mpirun's, every step "
              f"(step 4 loss {want[-1][1]:.6f})", f"srun   {got}\nmpirun {want}")

        # Without PMIx Open MPI would abort in MPI_Init naming no cause; pentad refuses first,
        # once (task 0), naming the fix (launch/rank.h).
        no_pmix, _ = run(["srun", "-n", "2", "--overcommit", "--mpi=none", pentad, "train",
                          recipe, *TRAIN], env)
        said = no_pmix.stderr.count("pentad: error: srun started this task without PMIx")
        check(failures, no_pmix.returncode != 0 and said == 1
              and "run srun --mpi=pmix" in no_pmix.stderr,
              f"srun --mpi=none is refused once, naming --mpi=pmix (exit {no_pmix.returncode})",
              no_pmix.stdout + no_pmix.stderr)

        # The shipped batch script: pentad launch (the supervisor inside the allocation)
        # over srun, then over mpirun reading the allocation from Slurm's environment.
        # Both at once: with --overcommit each holds one CPU of the node, so they run side
        # by side.
        t0 = time.monotonic()
        jobs = {}
        for launcher in ("srun", "mpirun"):
            jobs[launcher] = submit(["-n", str(RANKS), "--overcommit",
                                     f"--output={tmp}/sbatch-{launcher}.log", SBATCH, recipe,
                                     *TRAIN, "--set", f"train.out_dir={tmp}/sbatch-{launcher}"],
                                    dict(env, PENTAD=pentad, PENTAD_LAUNCHER=launcher))
        for launcher, (job_id, why) in jobs.items():
            state, seconds = wait_job(job_id, env, t0) if job_id else (why, 0.0)
            log = state
            if (tmp / f"sbatch-{launcher}.log").exists():
                log += "\n" + (tmp / f"sbatch-{launcher}.log").read_text()
            ok = state.startswith("COMPLETED 0:0")
            check(failures, ok and "the job finished" in log
                  and "no rank connected" not in log and "not every rank" not in log,
                  f"sbatch {Path(SBATCH).name} with {launcher}: pentad launch sees every rank "
                  f"finish ({seconds:.1f} s)", log)
            if ok:
                check(failures, losses(tmp / f"sbatch-{launcher}") == want,
                      f"the batch job over {launcher} trains the same losses")
    finally:
        stop(daemons)
        orphans = [f"{pid} (would not exit)" for pid in reap_orphans()]
        left = leftovers(tmp) + orphans
        shutil.rmtree(tmp, ignore_errors=True)
        check(failures, not left, "no process left behind after the daemons stop",
              ", ".join(left))
    print(f"{time.monotonic() - t_start:.1f} s in all")
    if failures:
        print(f"FAILED: {len(failures)}")
        return 1
    print("srun trains like mpirun")
    return 0


if __name__ == "__main__":
    sys.exit(main())
