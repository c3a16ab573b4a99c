#!/usr/bin/env python3
"""Zero-bubble pipelines (zb-h1, zb-v) against 1F1B and interleaved on this machine's cores.

For each schedule pentad trains the same model with --trace; per schedule it reports the
median step time (steps after warm-up, runs alternated A/B/C/D, ../shared/MEASURE.md) as a
ratio to 1F1B, the measured bubble (1 - mean busy / step window, from the trace, over the steps
run with the lists rebuilt for the measured passes), the simulator's bubble replaying the lists
with each pass as long as it took (step by step), with each chunk's mean pass (wall time),
with the means plus the executor's own time between passes and the transfers' measured time,
and with each pass drawn from its measured spread besides (the mean of 32 draws), the schedule's ideal bubble (F = B = W), the most activation memory any rank held (its slots
made, and a split backward's kept gradients), and the drain skew: the spread of the stages' last pass ends
over the step (what the optimizer step's synchronisation costs, which the papers'
post-validation would hide).

Before each table, the cores' steadiness: the same 1024^3 SGEMM (about a pass's length) run
over and over for 4 s on each core at once, bound, with pentad's OpenBLAS kernels
(build/pentad_sgemm_bench N 1 S): its coefficient of variation and its half-second means.
Identical work whose time varies is the machine's, not the schedule's; the measured bubble
takes in that spread where a late pass delays the stage waiting for it.

  p = 2: one rank per core, one thread a rank, ranks bound to cores (--bind-to core): the
         case the issue's speed goals are about.
  p = 4: four ranks on two cores (oversubscribed): a waiting stage lends its core.

usage: zero_bubble_bench.py [--quick] [PENTAD]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from blas_env import same_blas_kernels  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PENTAD = str(ROOT / "build" / "pentad")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive", OMPI_MCA_mpi_yield_when_idle="1")
MODEL = ["model.family=gpt2", "model.n_layer=8", "model.d_model=512", "model.n_head=8",
         "model.vocab_size=1024", "model.max_seq_len=128", "train.seq_len=128",
         "train.micro_batch=2", "train.threads=1", "data.source=random", "train.eval_every=0",
         "train.log_every=1000", "optim.warmup_steps=2"]
SCHEDULES = [("1f1b", 1), ("zb-h1", 1), ("zb-v", 2), ("interleaved", 2)]


def run(ranks, overrides, steps, bind):
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)]
        cmd += ["--bind-to", "core"] if bind else ["--bind-to", "none"]
        cmd += [PENTAD, "train", str(ROOT / "recipes" / "gpt-tiny.toml"),
                "--trace", f"{tmp}/trace.json"]
        for o in MODEL + overrides + [f"train.steps={steps}", f"train.out_dir={tmp}"]:
            cmd += ["--set", o]
        proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-2000:])
            raise SystemExit(f"pentad failed: {' '.join(overrides)}")
        rows = [json.loads(l) for l in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
        seconds = [r["seconds"] for r in rows if "seconds" in r]
        trace = json.loads(Path(f"{tmp}/trace.json").read_text())
        other = trace["otherData"]
        other["drain_skew"] = drain_skew(trace["traceEvents"])
        return seconds, other


def drain_skew(events):
    """Mean over steps (after the first two) of the spread of the ranks' last pass ends, as a
    fraction of the step window: how long the first stage to finish waits for the last before
    the optimizer step's gradient norm (what moving it after the step would save)."""
    last, first = {}, {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") == "wait activation" or "wait" in e.get("cat", ""):
            continue
        step, end = e["args"]["step"], e["ts"] + e["dur"]
        last.setdefault(step, {})
        last[step][e["tid"]] = max(last[step].get(e["tid"], 0), end)
        first[step] = min(first.get(step, e["ts"]), e["ts"])
    skews = [(max(r.values()) - min(r.values())) / (max(r.values()) - first[s])
             for s, r in last.items() if s > 2 and len(r) > 1]
    return statistics.mean(skews) if skews else 0.0


def steadiness(seconds=4):
    """Each core's run of the same SGEMM, all cores at once (bench/sgemm.cpp's steadiness)."""
    sgemm = str(Path(PENTAD).parent / "pentad_sgemm_bench")
    env = dict(ENV, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(["taskset", "-c", str(c), sgemm, "1024", "1", str(seconds)],
                              env=env, stdout=subprocess.PIPE, text=True)
             for c in sorted(os.sched_getaffinity(0))]
    for c, proc in zip(sorted(os.sched_getaffinity(0)), procs):
        print(f"core {c}: the same SGEMM, {proc.communicate()[0].strip()}")
    print()


def table(p, m, reps, steps, bind):
    print(f"p = {p}, m = {m}, {'ranks bound to cores' if bind else 'ranks sharing 2 cores'}")
    print()
    steadiness()
    print("| schedule | v | step s (x 1F1B) | bubble measured | replayed as timed | replayed at "
          "the means | + executor gaps (ms a pass) and transfers (ms) | + the passes' spread | "
          "ideal | activations MiB (most on a rank) | drain skew |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    times = {s: [] for s, _ in SCHEDULES}
    other = {s: [] for s, _ in SCHEDULES}
    for _ in range(reps):  # alternated
        for schedule, v in SCHEDULES:
            seconds, o = run(p, [f"parallel.pp={p}", f"parallel.pp_schedule={schedule}",
                                 f"parallel.virtual_stages={v}", f"train.grad_accum={m}"],
                             steps, bind)
            times[schedule] += seconds[2:]
            other[schedule].append(o)
    base = statistics.median(times["1f1b"])
    for schedule, v in SCHEDULES:
        t = statistics.median(times[schedule])
        o = other[schedule]
        med = lambda k: statistics.median(x[k] for x in o)
        print(f"| {schedule} | {v} | {t:.4f} ({t / base:.3f}) | "
              f"{med('measured_bubble_fraction'):.3f} | {med('timed_replay_bubble_fraction'):.3f} | "
              f"{med('replayed_bubble_fraction'):.3f} | "
              f"{med('gap_replay_bubble_fraction'):.3f} ({med('executor_gap_ms'):.3f}, "
              f"{med('transfer_ms'):.3f}) | {med('sampled_replay_bubble_fraction'):.3f} | "
              f"{o[0]['ideal_bubble_fraction']:.3f} | "
              f"{med('max_activation_bytes') / 2**20:.2f} | {med('drain_skew'):.3f} |")
    print()


def main():
    global PENTAD
    args = sys.argv[1:]
    quick = "--quick" in args
    args = [a for a in args if a != "--quick"]
    if args:
        PENTAD = args[0]
    same_blas_kernels(PENTAD)  # the SGEMM control runs pentad's kernels
    reps, steps = (1, 6) if quick else (3, 10)
    table(2, 8, reps, steps, True)
    if not quick:
        table(4, 8, reps, steps, False)


if __name__ == "__main__":
    main()
