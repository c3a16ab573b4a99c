#!/usr/bin/env python3
"""`pentad probe --quick` on 8 ranks as two simulated nodes of 4 (PENTAD_SIM_NODES=4:200:0.2:
200 us more and 0.2 GB/s between nodes) must see the nodes: islands exactly {0..3} and {4..7},
links between them far slower and later than inside, a collective whose groups span the
nodes lasting at least the simulated time, and (full tier, timed) slower than one whose groups
stay inside. Plus a run on one rank, and the refusals: an
output directory that does not exist, a malformed PENTAD_SIM_NODES.

usage: probe.py PENTAD WORKDIR
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1")
ENV.pop("PENTAD_SIM_NODES", None)
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def run(cmd, env=None, timeout=60):
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env or ENV, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t0


def mpirun(ranks, *args):
    return ["mpirun", "--oversubscribe", "-np", str(ranks), *args]


def main():
    pentad, work = sys.argv[1], Path(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    # Two simulated nodes of four ranks.
    out = work / "topology.json"
    env = dict(ENV, PENTAD_SIM_NODES="4:200:0.2")
    code, text, seconds = run(mpirun(8, pentad, "probe", "--quick", "-o", str(out)), env)
    print(text)
    check(code == 0, f"probe on 8 ranks exits 0 ({code}) in {seconds:.1f} s")
    if code != 0:
        return
    check("probe: pairs 0/28" in text, "progress names the pairs")
    check("2 islands: [0-3] [4-7]" in text, "the summary shows the two islands")
    topo = json.loads(out.read_text())
    check(topo["version"] == 1 and topo["ranks"] == 8 and len(topo["hosts"]) == 8,
          "version, ranks and one host per rank")
    check(topo["islands"] == [[0, 1, 2, 3], [4, 5, 6, 7]], f"islands {topo['islands']}")
    lat, bw = topo["latency_us"], topo["bandwidth_gbs"]
    inside = [(i, j) for i in range(8) for j in range(8) if i != j and i // 4 == j // 4]
    across = [(i, j) for i in range(8) for j in range(8) if i // 4 != j // 4]
    bw_in, bw_across = [bw[i][j] for i, j in inside], [bw[i][j] for i, j in across]
    lat_in, lat_across = [lat[i][j] for i, j in inside], [lat[i][j] for i, j in across]
    check(max(bw_across) < 0.3 and max(bw_across) < 0.5 * min(bw_in),
          f"bandwidth between nodes at most {max(bw_across):.3g} GB/s (simulated 0.2), inside "
          f"at least {min(bw_in):.3g}")
    check(min(lat_across) > 150 and
          statistics.median(lat_across) - statistics.median(lat_in) > 150,
          f"latency between nodes {min(lat_across):.0f} us at least, median "
          f"{statistics.median(lat_across):.0f} us against {statistics.median(lat_in):.0f} "
          "inside (simulated +200)")
    check(all(lat[i][i] == 0 and bw[i][i] == 0 for i in range(8)), "zero diagonals")
    samples = {(c["op"], c["size"], c["stride"]): c for c in topo["collectives"]}
    ops = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
    # Groups spanning the nodes sleep the ring model's time on every rank (docs/probe.md), so
    # every repetition, and the median, lasts at least that: 200 us + bytes / p at 0.2 GB/s a
    # step, all_reduce 2 (p - 1) steps, the others p - 1.
    for op in ops:
        for size, stride in ((4, 2), (2, 4), (8, 1)):
            c = samples[(op, size, stride)]
            steps = 2 * (size - 1) if op == "all_reduce" else size - 1
            floor = steps * (200e-6 + c["bytes"] / size / 0.2e9)
            check(c["seconds"] >= 0.99 * floor,
                  f"{op} over {size} ranks {stride} apart lasts at least the simulated "
                  f"{floor * 1e3:.3g} ms: {c['seconds'] * 1e3:.3g} ms")
    # Against groups inside a node: each op over 4 ranks (a simulated 4.5 to 9 ms more), and
    # the four ops together over 2 ranks (2.8 to 5.6 ms more each, where one noisy median of
    # a ms on 2 shared cores could reach it). Timed comparisons, so in the full tier only
    # (PENTAD_FULL_TESTS=1, scripts/test.sh --full): on 8 ranks sharing 2 loaded cores an
    # inside median once reached 5.69 ms against 5.59 across (CI, 2026-11-29). The default
    # tier keeps the floors above, which no load can undercut.
    if not os.environ.get("PENTAD_FULL_TESTS"):
        print("skipped: across against inside nodes, timed (PENTAD_FULL_TESTS=1 runs it)")
        ops = ()
    for op in ops:
        a, b = samples[(op, 4, 2)], samples[(op, 4, 1)]
        check(a["seconds"] > b["seconds"] and a["bus_gbs"] < b["bus_gbs"],
              f"{op} over 4 ranks 2 apart (across nodes) slower than 4 ranks 1 apart: "
              f"{a['seconds'] * 1e3:.3g} ms against {b['seconds'] * 1e3:.3g}")
    if ops:
        across_s = sum(samples[(op, 2, 4)]["seconds"] for op in ops)
        inside_s = sum(samples[(op, 2, 1)]["seconds"] for op in ops)
        check(across_s > inside_s, f"the four ops over 2 ranks 4 apart (across nodes) slower "
              f"than 2 ranks 1 apart: {across_s * 1e3:.3g} ms against {inside_s * 1e3:.3g}")
    check(len(topo["collectives"]) == 6 * 4, "every shape and op measured")

    # parallel.tp_shape = "auto" on this topology picks a 2D mesh over 1D and over the
    # column-first 2x4 (whose d2 groups of 4 ranks 2 apart all cross the nodes), the one
    # predicted fastest, and trains a step with it. 2x4 row, 4x2 row and 4x2 column are
    # predicted within about 15% of each other, so which of them wins follows the measured
    # medians, which move under load; the others are predicted at least 1.5x slower.
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "gpt-tiny.toml"
    code, text, _ = run(mpirun(8, pentad, "train", str(recipe), "model.d_model=128",
                               "model.n_head=8", "parallel.tp=8", "parallel.tp_shape=auto",
                               f"parallel.topology={out}", "train.steps=1", "train.eval_every=0",
                               "data.source=random", "train.threads=1",
                               f"train.out_dir={work / 'auto'}"), env)
    said = [l for l in text.splitlines() if "tp shape:" in l]
    chosen = re.search(r"tp shape: (\d+x\d+ \w+),", said[0]) if said else None
    predicted = {m[0]: float(m[1]) for m in
                 re.findall(r"(\d+x\d+(?: row| column)?) ([\d.]+) ms", said[0])} if said else {}
    check(code == 0 and len(said) == 1 and chosen is not None and "step     1/1" in text and
          chosen[1] in ("2x4 row", "4x2 row", "4x2 column") and
          predicted.get(chosen[1], 1e9) <= min(predicted.values()) * 1.01,
          f"tp_shape = auto picks 2x4 row, 4x2 row or 4x2 column, the least predicted, "
          f"said once ({code}): {said}")
    code, text, _ = run(mpirun(4, pentad, "train", str(recipe), "parallel.tp=4",
                               "parallel.tp_shape=auto", f"parallel.topology={out}",
                               "train.steps=1", f"train.out_dir={work / 'auto4'}"))
    check(code == 2 and "8 ranks" in text and str(out) in text,
          f"a topology of 8 ranks for 4 is refused naming the file ({code}): "
          f"{text.strip()[-200:]}")

    # One rank: nothing to pair, one island.
    one = work / "one.json"
    code, text, _ = run([pentad, "probe", "--quick", "-o", str(one)])
    check(code == 0 and json.loads(one.read_text())["islands"] == [[0]],
          f"probe on one rank writes one island ({code})")

    # Refusals: exit 2 and the message names what to change, before anything is measured.
    code, text, seconds = run(mpirun(2, pentad, "probe", "--quick", "-o",
                                     str(work / "no-such-dir" / "t.json")))
    check(code == 2 and "no-such-dir does not exist" in text and seconds < 10,
          f"a missing output directory is refused ({code}): {text.strip()[-200:]}")
    code, text, _ = run(mpirun(2, pentad, "probe", "--quick", "-o", str(work / "bad.json")),
                        dict(ENV, PENTAD_SIM_NODES="4:200"))
    check(code == 2 and 'PENTAD_SIM_NODES="4:200"' in text and "R:LAT_US:GBS" in text and
          text.count("pentad: error") == 1 and not (work / "bad.json").exists(),
          f"a malformed PENTAD_SIM_NODES is refused once ({code}): {text.strip()[-200:]}")


if __name__ == "__main__":
    main()
    if failures:
        print(f"{len(failures)} failed: " + "; ".join(failures))
        sys.exit(1)
    print("probe measures the simulated nodes")
