#!/usr/bin/env python3
"""Communication volume and data-parallel overlap of pentad's distributed layouts.

Part A (volume): trains a small GPT-2 for a few steps under several layouts (tensor
parallel with and without sequence parallel, data parallel, both) with --comm-log,
counts every collective per step per communicator from the trace, and compares it
with the count and bytes derived here from the model shape (formulas below).

Part B (overlap): for dp2 and dp2 x tp2 with small gradient buckets, measures how much
of the time the data-parallel bucket all-reduces were in flight lay before the end of
backward (hidden), and the exposed tail reduced_ns - backward_end_ns as a fraction of
the step. Peer in the same run: the same layout with one huge bucket (bucket_mb=1024),
which starts its single all-reduce only once backward is over (no overlap); runs
alternate A B A B.

usage: /usr/bin/python3 bench/comm_volume.py [--pentad build-lead/pentad] [--reps 3]
                                             [--steps 10] [--work bench/out/comm_volume]
Needs Open MPI's mpirun. Ranks run oversubscribed with train.threads=1 on small
machines, so timings are pessimistic (a rank may be descheduled while its peers wait).

Formulas (per optimizer step; L layers, b micro-batch, s sequence, h = d_model,
A = grad_accum micro-batches, p = tp degree, N = b*s, f = 4 bytes per float;
"bytes" is what this rank contributes: all_reduce = buffer, reduce_scatter = its
whole (N, h) input, all_gather = its (N/p, h) input):
  tp, no SP   all_reduce  (4L+2)*A of N*h*f   [2L+1 forward: embedding + attn/MLP
                                               outputs; 2L+1 backward: head + attn/MLP
                                               input grads]
              all_reduce  2*A of N*f, 2N*f    [vocab-parallel cross-entropy: row max,
                                               (sum exp, target logit) stats]
              all_reduce  1 of 8 bytes        [grad-norm sum of squares, f64]
  tp, SP      reduce_scatter (4L+2)*A of N*h*f   [each no-SP activation all_reduce]
              all_gather     (4L+2)*A of N*h*f/p [before each column-parallel block and
                                                  the head forward; backward: mirrored,
                                                  plus the embedding's gradient]
              all_reduce  same CE + norm ops, plus (4L+2) of h*f per step: the layer-norm
                          weight/bias gradients (2 norms x 2 per layer + final norm),
                          which SP leaves partial over tp
  dp_cp       all_reduce  buckets summing to parameters_local*f (one pass per step)
  dp          all_reduce  1 of 8 bytes (the step's loss)
Megatron's textbook count is 4L all-reduces of b*s*h per layer-stack per step (2
forward, 2 backward per layer); SP turns each into reduce_scatter + all_gather.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
F = 4  # bytes per float

# Part A: small model, every layout, grad_accum=2 to show the per-micro-batch scaling.
VOLUME_MODEL = dict(n_layer=2, d_model=64, n_head=4, vocab_size=512, max_seq_len=64,
                    seq_len=64, micro_batch=4, grad_accum=2)
VOLUME_LAYOUTS = [  # name, ranks, tp, sequence_parallel
    ("tp2", 2, 2, False),
    ("tp2+sp", 2, 2, True),
    ("tp4+sp", 4, 4, True),
    ("dp2", 2, 1, False),
    ("dp2xtp2", 4, 2, False),
    ("dp2xtp2+sp", 4, 2, True),
]
# Part B: 6 layers x 256 wide, buckets of ~1 MiB (about 19 buckets at tp1, 10 at tp2).
OVERLAP_MODEL = dict(n_layer=6, d_model=256, n_head=4, vocab_size=512, max_seq_len=64,
                     seq_len=64, micro_batch=4, grad_accum=1)
OVERLAP_LAYOUTS = [("dp2", 2, 1), ("dp2xtp2", 4, 2)]
SMALL_BUCKET_MB, ONE_BUCKET_MB = 1, 1024


def pentad_cmd(pentad, ranks, model, tp, sp, steps, bucket_mb, out_dir, log_dir):
    keys = {
        "model.n_layer": model["n_layer"], "model.d_model": model["d_model"],
        "model.n_head": model["n_head"], "model.vocab_size": model["vocab_size"],
        "model.max_seq_len": model["max_seq_len"], "train.seq_len": model["seq_len"],
        "train.micro_batch": model["micro_batch"], "train.grad_accum": model["grad_accum"],
        "train.steps": steps, "train.eval_every": 0, "train.threads": 1,
        "data.source": "random", "parallel.tp": tp,
        "parallel.sequence_parallel": "true" if sp else "false",
        "parallel.bucket_mb": bucket_mb, "train.out_dir": out_dir,
    }
    return (["mpirun", "--oversubscribe", "-np", str(ranks), str(pentad), "train",
             str(ROOT / "recipes/gpt-tiny.toml")] + [f"{k}={v}" for k, v in keys.items()] +
            ["--comm-log", str(log_dir)])


def run(cmd, log_dir, ranks):
    shutil.rmtree(log_dir, ignore_errors=True)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    logs = [json.loads((Path(log_dir) / f"rank{r}.json").read_text()) for r in range(ranks)]
    for lg in logs:
        if len(lg["events"]) >= 8192:
            sys.exit(f"rank {lg['rank']}: trace ring full, early steps lost; use fewer steps")
    return logs


def events_by_step(log):
    """{step index: [events]}; an event belongs to the step whose span contains enter_ns."""
    starts = [s["start_ns"] for s in log["steps"]]
    out = defaultdict(list)
    for e in log["events"]:
        idx = None
        for i, st in enumerate(starts):
            if e["enter_ns"] >= st:
                idx = i
        if idx is not None:  # before step 1: the start-up barrier
            out[idx].append(e)
    return out


# ---------------------------------------------------------------------------------- volume
def gpt2_local_params(m, p):
    C, V, S, L = m["d_model"], m["vocab_size"], m["max_seq_len"], m["n_layer"]
    per_layer = 12 * C * C // p + 7 * C // p + 6 * C  # sharded q,k,v,o,up,down (+biases); norms, o_b, down_b whole
    return L * per_layer + V * C // p + S * C + 2 * C  # tied wte (vocab parallel), wpe, final norm


def gpt2_param_sizes(m, p):
    """Parameter sizes in arena order (model.cpp build_params), for the bucket count."""
    C, V, S = m["d_model"], m["vocab_size"], m["max_seq_len"]
    sizes = [V * C // p, S * C]
    for _ in range(m["n_layer"]):
        sizes += [C, C, C * C // p, C // p, C * C // p, C // p, C * C // p, C // p,
                  C * C // p, C, C, C, 4 * C * C // p, 4 * C // p, 4 * C * C // p, C]
    return sizes + [C, C]


def bucket_count(sizes, bucket_mb):
    elems = max(1, int(bucket_mb * 1024 * 1024) // F)
    offsets, o = [], 0
    for s in sizes:
        offsets.append(o)
        o += s
    end, n = o, 0
    for i in range(len(sizes) - 1, -1, -1):
        if end - offsets[i] >= elems or i == 0:
            n, end = n + 1, offsets[i]
    return n


def expected(m, tp, dp, sp, bucket_mb):
    """{(comm, kind): (ops per step, bytes per step)} for one rank."""
    L, C, A = m["n_layer"], m["d_model"], m["grad_accum"]
    N = m["micro_batch"] * m["seq_len"]
    act = N * C * F
    e = {}
    if tp > 1:
        n_act = (4 * L + 2) * A
        ar_ops = 2 * A + 1
        ar_bytes = A * (N * F + 2 * N * F) + 8
        if sp:
            e[("tp", "reduce_scatter")] = (n_act, n_act * act)
            e[("tp", "all_gather")] = (n_act, n_act * act // tp)
            ar_ops += 4 * L + 2
            ar_bytes += (4 * L + 2) * C * F
        else:
            ar_ops += n_act
            ar_bytes += n_act * act
        e[("tp", "all_reduce")] = (ar_ops, ar_bytes)
    if dp > 1:
        e[("dp_cp", "all_reduce")] = (bucket_count(gpt2_param_sizes(m, tp), bucket_mb),
                                      gpt2_local_params(m, tp) * F)
        e[("dp", "all_reduce")] = (1, 8)
    return e


def measured(logs):
    """{(comm, kind): (ops, bytes, consistent)} per step, checked equal over steps and ranks."""
    per = defaultdict(set)  # key -> {(ops, bytes)} over (rank, step)
    keys = set()
    cells = []
    for lg in logs:
        for step, evs in events_by_step(lg).items():
            acc = defaultdict(lambda: [0, 0])
            for e in evs:
                acc[(e["comm"], e["kind"])][0] += 1
                acc[(e["comm"], e["kind"])][1] += e["bytes"]
            cells.append(acc)
            keys |= set(acc)
    for acc in cells:
        for k in keys:
            per[k].add(tuple(acc.get(k, (0, 0))))
    return {k: (*sorted(v)[len(v) // 2], len(v) == 1) for k, v in per.items()}


def volume(args, work):
    m = VOLUME_MODEL
    rows, cmds = [], []
    for name, ranks, tp, sp in VOLUME_LAYOUTS:
        dp = ranks // tp
        cmd = pentad_cmd(args.pentad, ranks, m, tp, sp, 3, SMALL_BUCKET_MB / 16,
                         work / "out", work / f"vol-{name}")
        cmds.append(" ".join(cmd))
        logs = run(cmd, work / f"vol-{name}", ranks)
        assert logs[0]["tp"] == tp and logs[0]["dp"] == dp and logs[0]["sequence_parallel"] == sp
        want = expected(m, tp, dp, sp, SMALL_BUCKET_MB / 16)
        if dp > 1 and logs[0]["parameters_local"] != gpt2_local_params(m, tp):
            print(f"!! {name}: parameters_local {logs[0]['parameters_local']} != formula "
                  f"{gpt2_local_params(m, tp)}")
        got = measured(logs)
        for k in sorted(set(want) | set(got)):
            go, gb, same = got.get(k, (0, 0, True))
            wo, wb = want.get(k, (0, 0))
            rows.append((name, *k, go, wo, gb, wb, gb / wb if wb else float("nan"), same))
    L, A = m["n_layer"], m["grad_accum"]
    N, C = m["micro_batch"] * m["seq_len"], m["d_model"]
    print(f"\n## Part A: bytes per step per communicator (GPT-2 L={L}, h={C}, heads={m['n_head']}, "
          f"V={m['vocab_size']}, b={m['micro_batch']}, s={m['seq_len']}, grad_accum={A}; "
          f"b*s*h*4 = {N * C * F} B)\n")
    print("| layout | comm | op | ops/step meas | ops/step formula | bytes/step meas | "
          "bytes/step formula | ratio |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    bad = 0
    for name, comm, kind, go, wo, gb, wb, ratio, same in rows:
        flag = "" if same else " (varies over steps/ranks; median shown)"
        if go != wo or gb != wb or not same:
            bad += 1
            flag += " **MISMATCH**" if (go != wo or gb != wb) else ""
        print(f"| {name} | {comm} | {kind} | {go} | {wo} | {gb:,} | {wb:,} | {ratio:.3f}{flag} |")
    print(f"\nTextbook Megatron: 4L = {4 * L} all-reduces of b*s*h per step per micro-batch "
          f"(x{A} micro-batches = {4 * L * A}); pentad does (4L+2)*A = {(4 * L + 2) * A}: the "
          "2 extra per micro-batch are the vocab-parallel embedding's forward all-reduce and the "
          "all-reduce of the head's input gradient in backward (the tied vocab-parallel head is a "
          "column-parallel layer). With SP each becomes reduce_scatter + all_gather, same count. "
          "The remaining tp all-reduces are small: cross-entropy row max (b*s floats) and stats "
          "(2*b*s floats) per micro-batch, one f64 grad-norm per step, and with SP the 4L+2 "
          "layer-norm weight/bias gradients (h floats each) that SP leaves partial.")
    print(f"Rows disagreeing with the formula or varying across steps/ranks: {bad}")
    return rows, cmds


# --------------------------------------------------------------------------------- overlap
def union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def overlap_stats(log):
    """Per step after the first: (hidden fraction, exposed tail / step, tail ms, step ms, buckets)."""
    res = []
    by_step = events_by_step(log)
    for i, s in enumerate(log["steps"]):
        if i == 0:
            continue  # warm-up
        bend, red = s["backward_end_ns"], s["reduced_ns"]
        iv = [(e["enter_ns"], e["leave_ns"] or red) for e in by_step[i]
              if e["comm"] == "dp_cp" and e["kind"] == "all_reduce"]
        u = union(iv)
        total = sum(b - a for a, b in u)
        hidden = sum(max(0, min(b, bend) - a) for a, b in u)
        step_ns = s["seconds"] * 1e9
        res.append(dict(hidden=hidden / total if total else float("nan"),
                        tail=(red - bend) / step_ns, tail_ms=(red - bend) / 1e6,
                        step_ms=step_ns / 1e6, inflight_ms=total / 1e6, buckets=len(iv),
                        # The last bucket (embedding) is posted, and polled, inside backward:
                        # from its post to reduced_ns is the communication left after compute.
                        post_ms=(red - max(a for a, _ in iv)) / 1e6 if iv else float("nan"),
                        started_before=sum(a < bend for a, _ in iv)))
    return res


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def overlap(args, work):
    m = OVERLAP_MODEL
    data = defaultdict(list)  # (layout, bucket_mb) -> [(rank, stats)]
    last = defaultdict(list)  # (layout, bucket_mb) -> [min over ranks of the tail, per step]
    last_post = defaultdict(list)  # same for last-bucket post -> reduced_ns
    cmds = []
    for rep in range(args.reps):
        for name, ranks, tp in OVERLAP_LAYOUTS:
            for bucket in (SMALL_BUCKET_MB, ONE_BUCKET_MB):  # A B A B
                d = work / f"ovl-{name}-{bucket}-{rep}"
                cmd = pentad_cmd(args.pentad, ranks, m, tp, False, args.steps, bucket,
                                 work / "out", d)
                if rep == 0:
                    cmds.append(" ".join(cmd))
                logs = run(cmd, d, ranks)
                per_rank = [overlap_stats(lg) for lg in logs]
                for lg, sts in zip(logs, per_rank):
                    data[(name, bucket)].extend((lg["rank"], st) for st in sts)
                # The rank that finished backward last waits least: its tail is the exposed
                # communication itself; the others' tails add the skew between ranks.
                for i in range(len(per_rank[0])):
                    last[(name, bucket)].append(min(sts[i]["tail_ms"] for sts in per_rank))
                    last_post[(name, bucket)].append(min(sts[i]["post_ms"] for sts in per_rank))
    print(f"\n## Part B: data-parallel overlap (GPT-2 L={m['n_layer']}, h={m['d_model']}, "
          f"b={m['micro_batch']}, s={m['seq_len']}, {args.steps} steps x {args.reps} runs, "
          "medians over steps 2..; train.threads=1, ranks oversubscribed on this machine's cores, "
          "so timings are pessimistic)\n")
    print("| layout | bucket_mb | buckets/step | in flight ms | hidden frac (rank0) | "
          "hidden frac (all) | tail/step (rank0) | tail/step (all) | tail ms (all) | "
          "tail ms, last rank | last post->reduced ms (all) | same, last rank | step ms (all) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    summary = {}
    for name, _, _ in OVERLAP_LAYOUTS:
        for bucket in (SMALL_BUCKET_MB, ONE_BUCKET_MB):
            rows = data[(name, bucket)]
            r0 = [st for r, st in rows if r == 0]
            al = [st for _, st in rows]
            f = lambda xs, k: med([x[k] for x in xs])  # noqa: E731
            summary[(name, bucket)] = dict(tail_ms=f(al, "tail_ms"), step_ms=f(al, "step_ms"),
                                           last_ms=med(last[(name, bucket)]),
                                           post_ms=med(last_post[(name, bucket)]))
            print(f"| {name} | {bucket} | {f(al, 'buckets'):.0f} | {f(al, 'inflight_ms'):.1f} | "
                  f"{f(r0, 'hidden'):.2f} | {f(al, 'hidden'):.2f} | {f(r0, 'tail'):.3f} | "
                  f"{f(al, 'tail'):.3f} | {f(al, 'tail_ms'):.1f} | {med(last[(name, bucket)]):.1f} | "
                  f"{f(al, 'post_ms'):.1f} | {med(last_post[(name, bucket)]):.1f} | "
                  f"{f(al, 'step_ms'):.0f} |")
    print("\nAgainst the one-bucket peer (its all-reduce starts after backward, nothing hidden):")
    for name, _, _ in OVERLAP_LAYOUTS:
        a, b = summary[(name, SMALL_BUCKET_MB)], summary[(name, ONE_BUCKET_MB)]
        print(f"  {name}: exposed tail (all ranks) {a['tail_ms']:.1f} ms vs {b['tail_ms']:.1f} ms "
              f"(ratio {a['tail_ms'] / b['tail_ms']:.2f}); last rank's tail {a['last_ms']:.1f} ms "
              f"vs {b['last_ms']:.1f} ms; last post->reduced, last rank {a['post_ms']:.1f} ms vs "
              f"{b['post_ms']:.1f} ms; step time ratio "
              f"{a['step_ms'] / b['step_ms']:.3f}")
    print("The one-bucket peer shows a nonzero 'hidden' fraction only because its single "
          "all-reduce is posted (and polled) by the last ready_from() inside backward, before "
          "backward_end_ns is stamped; the same holds for the last buckets of the bucketed run, "
          "hence the 'last post->reduced' columns. 'last rank' = per step the minimum over ranks "
          "(the rank that finished backward last waits least; the others' tails add rank skew).")
    print("Caveats: leave_ns is when a bucket was first *observed* complete (polled after each "
          "layer's backward), so in-flight time is an upper bound and 'hidden' counts time a "
          "bucket was posted, not necessarily progressing (Open MPI progresses non-blocking "
          "collectives inside MPI calls). The exposed tail against the peer is the direct measure.")
    return cmds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pentad", default=str(ROOT / "build-lead/pentad"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--work", default=str(ROOT / "bench/out/comm_volume"))
    args = ap.parse_args()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    # A private copy, so that a rebuild of the build directory during the run cannot
    # swap or remove the binary between runs.
    shutil.copy2(Path(args.pentad).resolve(), work / "pentad")
    args.pentad = work / "pentad"
    t0 = time.time()
    print(f"pentad {args.pentad} (copy of {ap.parse_args().pentad}); {os.cpu_count()} cores; train.threads=1 per rank "
          "(ranks oversubscribe the cores: timings are pessimistic)")
    _, vcmds = volume(args, work)
    ocmds = overlap(args, work)
    print("\nExample commands (Part A, Part B):\n  " + vcmds[1] + "\n  " + ocmds[0])
    print(f"\ntotal {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
