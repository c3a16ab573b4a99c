#!/usr/bin/env python3
"""Expert parallelism's all-to-all volume per step against a formula, and its share of time.

Trains recipes/mixtral-tiny.toml (every layer MoE) for a few steps under ep2 and ep4
(experts over the data-parallel ranks, mpirun) with --comm-log, counts the ep
communicator's collectives per step from the trace, and compares them with the counts and
bytes derived here from the shapes. Then reports the time the ep all-to-alls were in flight as a share of the step.

usage: /usr/bin/python3 bench/moe_comm_volume.py [--pentad build/pentad] [--steps 6]
                                                 [--work bench/out/moe_comm_volume]

Formula (per optimizer step and rank; L MoE layers, A = grad_accum micro-batches,
N = micro_batch * seq_len tokens per rank, k = top_k, C = d_model, E experts, P = ep
degree, f = 4 bytes per float; dropless routing; "bytes" is what this rank sends, the
block it keeps for its own experts included, as the trace counts it):
  all_to_all    L*A ops of E*4 bytes   (dispatch plan: every rank's per-expert counts)
  all_to_all_v  4*L*A ops:             forward dispatch (this rank's N*k picks) and combine
                                       (the R rows its experts computed, sent back), and the
                                       same two in backward (d(output) rows out, d(input)
                                       rows back):
                bytes = L*A*(2*N*k + 2*R)*C*f, R = rows routed to this rank's experts.
  Summed over the ranks R is the ranks' N*k picks, so the mean over ranks is exactly
  4*L*A*N*k*C*f in every step; one rank's figure is within its routing imbalance of it.
  Of this, (P-1)/P crosses between ranks when the routing is uniform.
Also traced, for the record: etp all_gather, L*A ops of E*4 bytes (the counts over the etp
group, of size 1 here); ep_etp all_reduce, 1 op of 8 bytes (the experts' share of the
gradient norm, summed once per expert).
"""
import argparse
import shutil
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comm_volume import events_by_step, run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
F = 4
MODEL = dict(n_layer=2, d_model=64, n_experts=8, top_k=2, d_ff_expert=128, micro_batch=4,
             seq_len=64, grad_accum=2)  # mixtral-tiny's shapes, a smaller micro-batch
LAYOUTS = [("ep2", 2), ("ep4", 4)]  # ep over dp: every rank holds its own tokens


def pentad_cmd(pentad, ranks, m, steps, out_dir, log_dir):
    keys = {
        "model.n_layer": m["n_layer"], "model.d_model": m["d_model"],
        "model.moe_layers": "all", "model.n_experts": m["n_experts"], "model.top_k": m["top_k"],
        "model.d_ff_expert": m["d_ff_expert"], "train.seq_len": m["seq_len"],
        "train.micro_batch": m["micro_batch"], "train.grad_accum": m["grad_accum"],
        "train.steps": steps, "train.eval_every": 0, "train.threads": 1,
        "data.source": "random", "parallel.ep": ranks, "train.out_dir": out_dir,
    }
    return (["mpirun", "--oversubscribe", "-np", str(ranks), str(pentad), "train",
             str(ROOT / "recipes/mixtral-tiny.toml")] + [f"{k}={v}" for k, v in keys.items()] +
            ["--comm-log", str(log_dir)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pentad", default=str(ROOT / "build/pentad"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--work", default=str(ROOT / "bench/out/moe_comm_volume"))
    args = ap.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    m = MODEL
    L, A, N, k, C, E = (m["n_layer"], m["grad_accum"], m["micro_batch"] * m["seq_len"],
                        m["top_k"], m["d_model"], m["n_experts"])
    mean_bytes = 4 * L * A * N * k * C * F
    print(f"mixtral-tiny: L={L} (all MoE), C={C}, E={E}, k={k}, d_ff_expert={m['d_ff_expert']}, "
          f"b={m['micro_batch']}, s={m['seq_len']}, grad_accum={A}; N*k*C*4 = {N * k * C * F} B")
    print("| layout | rank | op | ops/step meas | ops/step formula | bytes/step meas (median "
          "over steps) | bytes/step formula (mean over ranks) | ratio | in flight / step |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for name, P in LAYOUTS:
        cmd = pentad_cmd(args.pentad, P, m, args.steps, work / "out", work / name)
        print(f"<!-- {' '.join(cmd)} -->")
        logs = run(cmd, work / name, P)
        # Every step's all_to_all_v bytes summed over the ranks: exactly P times the formula.
        rank_sums = defaultdict(int)
        for lg in logs:
            for i, evs in events_by_step(lg).items():
                rank_sums[i] += sum(e["bytes"] for e in evs
                                    if e["comm"] == "ep" and e["kind"] == "all_to_all_v")
        # In each step a rank's all_to_all_v alternate dispatch (its N*k picks: exactly
        # N*k*C*f bytes) and combine (the R rows its experts computed): check every dispatch.
        dispatch_exact = all(
            e["bytes"] == N * k * C * F
            for lg in logs for i, evs in events_by_step(lg).items()
            for e in [x for x in evs if x["comm"] == "ep" and x["kind"] == "all_to_all_v"][::2])
        for lg in logs:
            per_step = defaultdict(list)  # (comm, kind) -> [(ops, bytes, seconds, step s)]
            by_step = events_by_step(lg)
            for i, s in enumerate(lg["steps"]):
                if i == 0:
                    continue  # warm-up: the first step pays for start-up
                acc = defaultdict(lambda: [0, 0, 0.0])
                for e in by_step[i]:
                    a = acc[(e["comm"], e["kind"])]
                    a[0] += 1
                    a[1] += e["bytes"]
                    a[2] += (e["leave_ns"] - e["enter_ns"]) / 1e9
                for key, (ops, nbytes, secs) in acc.items():
                    per_step[key].append((ops, nbytes, secs, s["seconds"]))
            for (comm, kind), cells in sorted(per_step.items()):
                if comm not in ("ep", "etp", "ep_etp"):
                    continue
                ops = statistics.median(c[0] for c in cells)
                nbytes = statistics.median(c[1] for c in cells)
                share = statistics.median(c[2] / c[3] for c in cells)
                if kind == "all_to_all":
                    want_ops, want_bytes = L * A, L * A * E * F
                elif kind == "all_to_all_v":
                    want_ops, want_bytes = 4 * L * A, mean_bytes
                elif comm == "etp" and kind == "all_gather":
                    want_ops, want_bytes = L * A, L * A * E * F
                elif comm == "ep_etp" and kind == "all_reduce":
                    want_ops, want_bytes = 1, 8
                else:
                    want_ops, want_bytes = 0, 0
                ratio = nbytes / want_bytes if want_bytes else float("nan")
                print(f"| {name} | {lg['rank']} | {comm} {kind} | {ops:g} | {want_ops} | "
                      f"{nbytes:,.0f} | {want_bytes:,} | {ratio:.3f} | {share:.1%} |")
        ratios = [rank_sums[i] / (P * mean_bytes) for i in sorted(rank_sums) if i > 0]
        print(f"| {name} | all, per step | ep all_to_all_v | | | sum / {P} | {mean_bytes:,} | "
              f"{min(ratios):.4f}-{max(ratios):.4f} | |")
        print(f"<!-- {name}: every dispatch all_to_all_v (every other one) is exactly "
              f"N*k*C*4 = {N * k * C * F} B: {'yes' if dispatch_exact else 'NO'} -->")
        others = sorted({(e["comm"], e["kind"]) for lg in logs for e in lg["events"]
                         if e["comm"] not in ("ep", "etp", "ep_etp")})
        print(f"<!-- {name}: other communicators in the trace: {others} -->")


if __name__ == "__main__":
    main()
