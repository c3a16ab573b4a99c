#!/usr/bin/env python3
"""Context parallelism's communication volume per step, from the trace, against formulas.

Trains recipes/llama-tiny.toml for a few steps under cp 2 and 4 (Ulysses, ring, and the
hybrid of a 2-rank Ulysses inside a 2-rank ring) with --comm-log, sums per step the bytes
of the cp communicators' attention traffic (all_to_all on the Ulysses group, send on the
ring group; the pure forms' group is "cp", the hybrid's "cp_ulysses" and "cp_ring"), and
compares them with the formulas below, derived from parallel/cp/context_parallel.cpp.

usage: /usr/bin/python3 bench/cp_comm_volume.py [--pentad build/pentad] [--steps 4]
                                                [--work bench/out/cp_comm_volume]

Formulas (per optimizer step and rank; L layers, A = grad_accum micro-batches, b micro-batch,
T sequence, D head dim, Hq / Hkv query / kv heads per rank (after tp), e = 4 bytes; cp =
U x R ranks, U the Ulysses degree, R the ring degree; t = T / (U R) tokens per rank;
kvc = max(1, Hkv / U) kv heads per rank after the Ulysses exchange (kv heads replicated
when U > Hkv); recompute off). The trace counts an all_to_all as its whole send buffer (the
block a rank keeps for itself included) and a send as its buffer:
  Ulysses, per all_to_all: s_q = b t Hq D e (q, out, dout, dq),
                           s_kv = U b t kvc D e (k, v, dk, dv: U blocks of kvc heads)
    forward   2 s_q + 2 s_kv   q, k, v to heads; out back to sequence
    backward  4 s_q + 4 s_kv   q, k, v, out, dout to heads again (not kept per layer);
                               dq, dk, dv back
    of which (U-1)/U leaves the rank.
  Ring, per send: kv = 2 b (T/R) kvc D e (one K/V block, k and v packed; kvc = Hkv at U = 1)
    forward   (R-1) kv         each block but the last moves on while the current computes
    backward  (R-1) kv + R kv  K/V again, and each block's dK/dV partial, R hops to its owner
  Step = L A (forward + backward) for each group.
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
E = 4
MODEL = dict(n_layer=2, d_model=64, n_head=8, vocab_size=512, seq_len=256, micro_batch=2,
             grad_accum=2)
# name, ranks, cp_impl, Ulysses degree, n_kv_head
LAYOUTS = [
    ("ulysses2", 2, "ulysses", 2, 4),
    ("ulysses4", 4, "ulysses", 4, 4),
    ("ulysses4, kv 2", 4, "ulysses", 4, 2),  # U > Hkv: kv heads replicated
    ("ring2", 2, "ring", 1, 4),
    ("ring4", 4, "ring", 1, 4),
    ("hybrid 2x2", 4, "hybrid", 2, 4),
    ("hybrid 2x2, kv 2", 4, "hybrid", 2, 2),
]


def pentad_cmd(pentad, ranks, impl, U, kv, steps, out_dir, log_dir):
    m = MODEL
    keys = {
        "model.n_layer": m["n_layer"], "model.d_model": m["d_model"], "model.n_head": m["n_head"],
        "model.n_kv_head": kv, "model.vocab_size": m["vocab_size"],
        "model.max_seq_len": m["seq_len"], "train.seq_len": m["seq_len"],
        "train.micro_batch": m["micro_batch"], "train.grad_accum": m["grad_accum"],
        "train.steps": steps, "train.eval_every": 0, "train.threads": 1,
        "data.source": "random", "parallel.cp": ranks, "parallel.cp_impl": impl,
        "train.out_dir": out_dir,
    }
    if impl == "hybrid":
        keys["parallel.cp_ulysses"] = U
    return (["mpirun", "--oversubscribe", "-np", str(ranks), str(pentad), "train",
             str(ROOT / "recipes/llama-tiny.toml")] +
            [x for k, v in keys.items() for x in ("--set", f"{k}={v}")] +
            ["--comm-log", str(log_dir)])


def formulas(U, R, kv_heads):
    """{(group, kind): bytes per step} for one rank."""
    m = MODEL
    L, A, B, T = m["n_layer"], m["grad_accum"], m["micro_batch"], m["seq_len"]
    Hq, D = m["n_head"], m["d_model"] // m["n_head"]
    kvc = max(1, kv_heads // U)
    t = T // (U * R)
    out = {}
    if U > 1:
        s_q, s_kv = B * t * Hq * D * E, U * B * t * kvc * D * E
        out["ulysses"] = L * A * ((2 * s_q + 2 * s_kv) + (4 * s_q + 4 * s_kv))
    if R > 1:
        kv = 2 * B * (T // R) * kvc * D * E
        out["ring"] = L * A * ((R - 1) * kv + (R - 1) * kv + R * kv)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pentad", default=str(ROOT / "build/pentad"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--work", default=str(ROOT / "bench/out/cp_comm_volume"))
    args = ap.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    m = MODEL
    print(f"llama-tiny: L={m['n_layer']}, d_model={m['d_model']}, n_head={m['n_head']} "
          f"(D={m['d_model'] // m['n_head']}), b={m['micro_batch']}, T={m['seq_len']}, "
          f"grad_accum={m['grad_accum']}, fp32, recompute off")
    print("| layout | group | op | ops/step | bytes/step measured (every rank, every step) | "
          "bytes/step formula | ratio | leaves the rank |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    failed = False
    for name, P, impl, U, kv in LAYOUTS:
        R = P // U
        tag = name.replace(" ", "").replace(",", "_")
        cmd = pentad_cmd(args.pentad, P, impl, U, kv, args.steps, work / "out", work / tag)
        print(f"<!-- {' '.join(cmd)} -->")
        logs = run(cmd, work / tag, P)
        want = formulas(U, R, kv)
        groups = {"ulysses": ("cp" if R == 1 else "cp_ulysses", "all_to_all"),
                  "ring": ("cp" if U == 1 else "cp_ring", "send")}
        for role, want_bytes in want.items():
            comm, kind = groups[role]
            cells = []  # (ops, bytes) per rank and step
            recv_match = True
            for lg in logs:
                for i, evs in sorted(events_by_step(lg).items()):
                    if i == 0:
                        continue  # the first step: start-up traffic may fall in it
                    mine = [e for e in evs if e["comm"] == comm and e["kind"] == kind]
                    cells.append((len(mine), sum(e["bytes"] for e in mine)))
                    if kind == "send":
                        got = sum(e["bytes"] for e in evs
                                  if e["comm"] == comm and e["kind"] == "recv")
                        recv_match &= got == cells[-1][1]
            lo, hi = min(c[1] for c in cells), max(c[1] for c in cells)
            ops = statistics.median(c[0] for c in cells)
            worst = max(abs(lo / want_bytes - 1), abs(hi / want_bytes - 1))
            failed |= worst > 0.05
            ratio = f"{lo / want_bytes:.4f}" if lo == hi else \
                f"{lo / want_bytes:.4f}-{hi / want_bytes:.4f}"
            crossing = f"{(U - 1) / U:.0%}" if role == "ulysses" else "100%"
            meas = f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"
            print(f"| {name} | {comm} | {kind} | {ops:g} | {meas} | {want_bytes:,} | {ratio} | "
                  f"{crossing} |")
            if kind == "send" and not recv_match:
                print(f"<!-- {name}: recv bytes differ from send bytes in some step -->")
        cp_names = {"cp", "cp_ulysses", "cp_ring"}
        others = sorted({(e["comm"], e["kind"]) for lg in logs for e in lg["events"]
                         if e["comm"] in cp_names and
                         (e["comm"], e["kind"]) not in {groups[r] for r in want} and
                         e["kind"] != "recv"})
        print(f"<!-- {name}: other operations on the cp groups: {others} -->")
    if failed:
        sys.exit("some measured volume is more than 5% from its formula")


if __name__ == "__main__":
    main()
