#!/usr/bin/env python3
"""Every parallel layout trains exactly like one rank.

For one recipe, trains 20 steps on one rank and under each layout (mpirun) and compares
them in three ways, each against a bound that says why it holds:

1. Step 1's reduced gradients, every tensor (reassembled from its tp shards through its
   global identity): the layout sums the same products in another order (dp ranks, tp
   partial sums, micro-batches), so each gradient matches to rounding, 1e-5 relative to
   the tensor's norm. A real layout bug (a missing all-reduce, a wrong shard, a partial
   sum counted twice) changes some gradient by O(1) and fails here, loudly and by name.
2. Every step's loss, 1e-5 relative.
3. The weights after 20 steps, against the scale of Adam's own steps. Adam moves an
   element by about lr per step whatever its gradient's size (m / sqrt(v) is nearly the
   gradient's sign), so sum(lr) * sqrt(n) is as far as a tensor of n elements can move.
   That is also how rounding grows: an element whose gradient is near zero gets a
   +-lr update whose sign a 1e-7 change in summation order can flip, and the attention
   biases hold many such elements (q.bias drifts 2e-5 of its own norm in 20 steps on an
   AVX2 core, which is why a plain 1e-5 on weights failed there). Only the few elements
   at noise level flip, while a layout bug redirects the whole tensor's updates. So a
   tensor passes when ||w - w_one_rank|| is within 1e-5 of its norm or within
   ADAM_FRACTION of sum(lr) * sqrt(n); the broken variants below move the tensors they
   break by 15-40% of it.

The one-rank run for a layout with data-parallel degree d reads the same global batch:
the same micro-batch size with d times the gradient accumulation.

Unless --pipeline, it then runs deliberately broken layouts (PENTAD_INJECT_BUG: dp2 with
one gradient bucket never all-reduced; dp2 x tp2 + sp without the tp sum of the norms'
gradients) and fails unless the checks above catch each of them.

With --pipeline, the layouts are pipeline-parallel ones (every schedule, interleaved
stages, the zero-bubble schedules, and pipeline x data x tensor parallel) on an 8-layer
model with 4 micro-batches; --pipeline-blocks, the rows of them whose work depends on the
model's blocks (PIPELINE_BLOCK_LAYOUTS), for a second family.

With --moe (an MoE recipe), the layouts are expert-parallel ones: ep over data-parallel
ranks, ep folded over tensor-parallel ranks (MoE Parallel Folding), etp, ep x pp, and
capacity-factor runs; the broken variant skips the experts' gradient all-reduce over edp.
Routing is a discrete choice: a token whose top-k scores (plus selection bias) tie within
rounding may pick another expert under another layout, and the aux-loss-free bias rule
(a sign of integer counts) turns one such flip into a 2 * rate jump of a bias element. At
the recipes' rate (1e-3) no layout flips a pick in 20 steps; at 1e-2 two of nine did
(losses still within 3e-6), and on an AVX2 core a capacity ranking flipped at 1e-3. So
the MoE runs also compare every step's routing (picks per expert and layer, fraction
dropped: integers, equal under every layout); at the first step f where they differ, a
near-tie went the other way: that is accepted only after step 1 and for at most two picks,
the losses are compared before step f and the final weights are not compared.

With --context, the layouts are context-parallel ones: Ulysses and ring at cp 2 and 4, the
2 x 2 hybrid, cp x tp with sequence parallelism, cp x dp, cp x pp (1F1B) and, when the
overrides set model.n_kv_head, Ulysses over more ranks than kv heads; the broken variant
drops the dK/dV the ring brings back from the other rank.

With --zero, the layouts shard the optimizer state (parallel.zero = 1), the gradients (2)
and the parameters (3) over dp 2 and 4, dp x tp (+ sp), dp x cp and dp x pp (stage 1, with
the tied embedding's shares on both end stages); the broken variants skip one bucket's
all-gather of the updated parameters (stage 1), and keep a unit gathered before the update
(stage 3: its other shares stale).

With --moe-zero (an MoE recipe), ZeRO 1, 2 and 3 with expert parallelism: the dense
parameters' state sharded over dp x cp, the experts' over their own replicas, edp (2, and 1
where each expert has no replica, so the experts' shares are whole); two layouts fold ep over
tp ranks (stages 1 and 3), one slices the experts over etp. At stage 3 the parameters are
sharded too, each layer's dense ones gathered over dp x cp and its experts' over edp around
its use. The broken variants skip the all-gather of the experts' updated parameters over
edp (stage 1), never gather the experts' units (stage 3: pentad refuses, naming a parameter
used outside its unit),
and keep the experts' units once gathered (stage 3: stale after the first update).

usage: layout_equivalence.py [--pipeline | --pipeline-blocks | --moe | --context | --zero | --moe-zero] PENTAD
                             RECIPE WORKDIR
                             [section.key=value ...]
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

import blas_core
from shards import load_weights

TOL = 1e-5
# Weights may differ from one rank by this fraction of Adam's largest possible movement
# (item 3 of the docstring).
ADAM_FRACTION = 1e-3
# After one step the reach is lr * sqrt(n), and an element whose gradient is rounding noise
# may take +lr on one side and -lr on the other (AdamW's first step is lr * sign(g)): each such
# flip is 2 / sqrt(n) of the reach, so the one-step runs (--moe-zero) allow a few in a
# tensor. A share never all-gathered differs by most of the reach.
STEP1_ADAM_FRACTION = 0.1
STEPS = 20
ACCUM = 2
# (name, ranks, overrides); dp is what is left of the ranks after tp.
LAYOUTS = [
    ("dp2", 2, ["parallel.tp=1"]),
    ("dp4", 4, ["parallel.tp=1"]),
    ("tp2", 2, ["parallel.tp=2"]),
    ("tp4", 4, ["parallel.tp=4"]),
    ("tp2+sp", 2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    ("dp2xtp2", 4, ["parallel.tp=2"]),
    ("dp2xtp2+sp", 4, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
]
PIPELINE_ACCUM = 4
PIPELINE_COMMON = ["model.n_layer=8"]
PIPELINE_LAYOUTS = [
    ("pp2-gpipe", 2, ["parallel.pp=2", "parallel.pp_schedule=gpipe"]),
    ("pp2-1f1b", 2, ["parallel.pp=2", "parallel.pp_schedule=1f1b"]),
    ("pp2-2f2b", 2, ["parallel.pp=2", "parallel.pp_schedule=kfkb", "parallel.pp_group=2"]),
    ("pp2-adaptive", 2, ["parallel.pp=2", "parallel.pp_schedule=adaptive",
                         "parallel.pp_adapt_every=3"]),
    # Data-parallel replicas must agree on k (each measures its own times; world rank 0
    # decides): with replicas choosing apart, gradient buckets met in different orders.
    ("pp2xdp2-adaptive", 4, ["parallel.pp=2", "parallel.tp=1", "parallel.pp_schedule=adaptive",
                             "parallel.pp_adapt_every=2", "parallel.pp_link_delay_ms=1"]),
    ("pp4-gpipe", 4, ["parallel.pp=4", "parallel.pp_schedule=gpipe"]),
    ("pp4-1f1b", 4, ["parallel.pp=4", "parallel.pp_schedule=1f1b"]),
    ("pp4-3f3b", 4, ["parallel.pp=4", "parallel.pp_schedule=kfkb", "parallel.pp_group=3"]),
    ("pp2-uneven", 2, ["parallel.pp=2", "parallel.pp_layout=3,5"]),
    ("pp2-interleaved-v2", 2, ["parallel.pp=2", "parallel.pp_schedule=interleaved",
                               "parallel.virtual_stages=2"]),
    ("pp4-interleaved-v2", 4, ["parallel.pp=4", "parallel.pp_schedule=interleaved",
                               "parallel.virtual_stages=2"]),
    # Zero-bubble: every backward split into B and W, W deferred (ZB-V: chunks in a V, the
    # tied embedding's two uses on the first stage); with dp and ZeRO-1, and recompute.
    ("pp2-zb-h1", 2, ["parallel.pp=2", "parallel.pp_schedule=zb-h1"]),
    ("pp4-zb-h1", 4, ["parallel.pp=4", "parallel.pp_schedule=zb-h1"]),
    ("pp2-zb-v", 2, ["parallel.pp=2", "parallel.pp_schedule=zb-v", "parallel.virtual_stages=2"]),
    ("pp4-zb-v", 4, ["parallel.pp=4", "parallel.pp_schedule=zb-v", "parallel.virtual_stages=2"]),
    ("pp2xdp2-zb-v-zero1", 4, ["parallel.pp=2", "parallel.tp=1", "parallel.pp_schedule=zb-v",
                               "parallel.virtual_stages=2", "parallel.zero=1"]),
    ("pp2xtp2-zb-v+sp", 4, ["parallel.pp=2", "parallel.tp=2", "parallel.pp_schedule=zb-v",
                            "parallel.virtual_stages=2", "parallel.sequence_parallel=true"]),
    # Recompute: B rebuilds each layer, keeping what W reads in the slot (under sp this
    # rank's rows of d(attention output) apart, which W gathers again).
    ("pp2xtp2-zb-v-recompute+sp", 4, ["parallel.pp=2", "parallel.tp=2",
                                      "parallel.pp_schedule=zb-v", "parallel.virtual_stages=2",
                                      "model.recompute=true", "parallel.sequence_parallel=true"]),
    ("pp2xdp2xtp2-1f1b", 8, ["parallel.pp=2", "parallel.tp=2", "parallel.pp_schedule=1f1b"]),
    ("pp2xdp2xtp2-2f2b+sp", 8, ["parallel.pp=2", "parallel.tp=2", "parallel.pp_schedule=kfkb",
                                "parallel.pp_group=2", "parallel.sequence_parallel=true"]),
]
# --pipeline-blocks: the rows whose work depends on the model's blocks (each block kind's
# backward split into B and W at p 2 and 4, under recompute and tp + sp; 1F1B and the
# interleaved schedule over them), for a second family; the order of the passes alone
# (GPipe, kFkB, adaptive, uneven cuts, dp) is the same whatever the blocks and --pipeline
# proves it on GPT-2.
PIPELINE_BLOCK_LAYOUTS = ["pp2-1f1b", "pp4-interleaved-v2", "pp2-zb-h1", "pp4-zb-h1", "pp2-zb-v",
                          "pp4-zb-v", "pp2xtp2-zb-v+sp", "pp2xtp2-zb-v-recompute+sp",
                          "pp2xdp2xtp2-2f2b+sp"]
SP = "parallel.sequence_parallel=true"
MOE_LAYOUTS = [
    ("ep2", 2, ["parallel.ep=2"]),
    ("ep4", 4, ["parallel.ep=4"]),
    ("dp4xep2", 4, ["parallel.ep=2"]),  # experts replicated over edp 2
    ("ep4-on-dp2xtp2+sp", 4, ["parallel.tp=2", SP, "parallel.ep=4"]),  # folding
    ("etp2", 2, ["parallel.etp=2"]),
    ("ep2xetp2-on-tp2+sp", 4, ["parallel.tp=2", SP, "parallel.ep=2", "parallel.etp=2"]),
    ("ep2xpp2-1f1b", 4, ["parallel.pp=2", "parallel.ep=2", "parallel.pp_schedule=1f1b"]),
    # Zero-bubble: the MoE layers' backward split into B (the dispatch's all-to-alls) and W.
    ("ep2xpp2-zb-h1", 4, ["parallel.pp=2", "parallel.ep=2", "parallel.pp_schedule=zb-h1"]),
    ("ep2xpp2-zb-v", 4, ["parallel.pp=2", "parallel.ep=2", "parallel.pp_schedule=zb-v",
                         "parallel.virtual_stages=2", "model.n_layer=4"]),
    ("ep2-capacity1.0", 2, ["parallel.ep=2", "moe.capacity_factor=1.0"]),
    ("ep4-tp2+sp-capacity1.25", 4, ["parallel.tp=2", SP, "parallel.ep=4",
                                    "moe.capacity_factor=1.25"]),
    # Context parallelism: the micro-batch's statistics (balancing losses, capacity) summed
    # over the cp ranks that hold its tokens.
    ("cp2-ring-xep2", 2, ["parallel.cp=2", "parallel.cp_impl=ring", "parallel.ep=2"]),
    ("cp2-ulysses-xtp2+sp-ep4-capacity1.0", 4,
     ["parallel.cp=2", "parallel.cp_impl=ulysses", "parallel.tp=2", SP, "parallel.ep=4",
      "moe.capacity_factor=1.0"]),
]
RING = "parallel.cp_impl=ring"
ULYSSES = "parallel.cp_impl=ulysses"
CONTEXT_LAYOUTS = [
    ("cp2-ulysses", 2, ["parallel.cp=2", ULYSSES]),
    ("cp4-ulysses", 4, ["parallel.cp=4", ULYSSES]),
    ("cp2-ring", 2, ["parallel.cp=2", RING]),
    ("cp4-ring", 4, ["parallel.cp=4", RING]),
    ("cp4-hybrid2x2", 4, ["parallel.cp=4", "parallel.cp_impl=hybrid", "parallel.cp_ulysses=2"]),
    ("cp2xtp2+sp-ring", 4, ["parallel.cp=2", RING, "parallel.tp=2", SP]),
    ("cp2xtp2-ulysses", 4, ["parallel.cp=2", ULYSSES, "parallel.tp=2"]),
    ("cp2xdp2-ring", 4, ["parallel.cp=2", RING]),
    ("cp2xpp2-1f1b", 4, ["parallel.cp=2", RING, "parallel.pp=2", "parallel.pp_schedule=1f1b"]),
    ("cp2xpp2-zb-h1", 4, ["parallel.cp=2", ULYSSES, "parallel.pp=2",
                          "parallel.pp_schedule=zb-h1"]),
]
ZERO = "parallel.zero="
ZERO_LAYOUTS = [
    ("dp2-zero1", 2, ["parallel.tp=1", ZERO + "1"]),
    ("dp2-zero2", 2, ["parallel.tp=1", ZERO + "2"]),
    ("dp4-zero1", 4, ["parallel.tp=1", ZERO + "1"]),
    ("dp4-zero2", 4, ["parallel.tp=1", ZERO + "2"]),
    # Buckets of 64 KiB: many buckets, shares cut inside matrices at row boundaries.
    ("dp4-zero2-buckets64k", 4, ["parallel.tp=1", ZERO + "2", "parallel.bucket_mb=0.0625"]),
    ("dp2xtp2-zero1-buckets64k", 4, ["parallel.tp=2", ZERO + "1", "parallel.bucket_mb=0.0625"]),
    ("dp2xtp2-zero1", 4, ["parallel.tp=2", ZERO + "1"]),
    ("dp2xtp2+sp-zero2", 4, ["parallel.tp=2", SP, ZERO + "2"]),
    ("dp2xcp2-ring-zero2", 4, ["parallel.tp=1", "parallel.cp=2", RING, ZERO + "2"]),
    # Stage 3: each layer's parameters gathered around its forward and backward.
    ("dp2-zero3", 2, ["parallel.tp=1", ZERO + "3"]),
    ("dp4-zero3", 4, ["parallel.tp=1", ZERO + "3"]),
    ("dp2xtp2+sp-zero3", 4, ["parallel.tp=2", SP, ZERO + "3"]),
    ("dp2xcp2-ulysses-zero3", 4, ["parallel.tp=1", "parallel.cp=2", ULYSSES, ZERO + "3"]),
    ("dp2-zero3-recompute", 2, ["parallel.tp=1", ZERO + "3", "model.recompute=true"]),
    # The tied embedding's shares on the first and last stages are cut alike.
    ("dp2xpp2-1f1b-zero1", 4, ["parallel.tp=1", "parallel.pp=2", "parallel.pp_schedule=1f1b",
                               ZERO + "1"]),
    # Stage 2 under pipelining: each chunk's buckets reduced after each of its backward
    # passes (interleaved: two chunks a stage, small buckets) or Ws (zb-v: the V, the tied
    # embedding's two uses on the first stage).
    ("dp2xpp2-interleaved-zero2-buckets64k", 4,
     ["parallel.tp=1", "parallel.pp=2", "parallel.pp_schedule=interleaved",
      "parallel.virtual_stages=2", ZERO + "2", "parallel.bucket_mb=0.0625", "model.n_layer=4"]),
    ("dp2xpp2-zb-v-zero2", 4, ["parallel.tp=1", "parallel.pp=2", "parallel.pp_schedule=zb-v",
                               "parallel.virtual_stages=2", ZERO + "2", "model.n_layer=4"]),
    # Stage 3 under pipelining: each pass gathers the units it reads (B and W each).
    ("dp2xpp2-1f1b-zero3", 4, ["parallel.tp=1", "parallel.pp=2", "parallel.pp_schedule=1f1b",
                               ZERO + "3"]),
    ("dp2xpp2-zb-v-zero3", 4, ["parallel.tp=1", "parallel.pp=2", "parallel.pp_schedule=zb-v",
                               "parallel.virtual_stages=2", ZERO + "3", "model.n_layer=4"]),
]
MOE_ZERO_LAYOUTS = [
    ("dp4xep2-zero1", 4, ["parallel.ep=2", ZERO + "1"]),  # experts' state over edp 2
    ("dp4xep2-zero2", 4, ["parallel.ep=2", ZERO + "2"]),
    ("dp2xep2-zero2", 2, ["parallel.ep=2", ZERO + "2"]),  # edp 1: the experts' shares whole
    # Stage 3 under zb-h1: the experts' reducer narrowed to each chunk's buckets too, and
    # their units gathered by B and W (stage 2's windows are the same; its dense layouts
    # run in --zero).
    ("ep2xpp2-zb-h1-zero3", 4, ["parallel.pp=2", "parallel.ep=2", "parallel.pp_schedule=zb-h1",
                                ZERO + "3"]),
    # Folded: attention on dp2 x tp2, the experts on edp2 x ep2 with ep over the tp ranks.
    ("ep2-on-dp2xtp2+sp-zero1", 4, ["parallel.tp=2", SP, "parallel.ep=2", ZERO + "1"]),
    # Stage 3: each layer's dense parameters gathered over dp, its routed experts over edp
    # (2; 1: whole on their rank; the experts sliced over etp 2 and replicated over edp 2;
    # ep 1: edp is the dp group itself; ep folded over tp 2 + sp, so each tp rank gathers
    # its own slices of the attention over dp 2 and its experts over edp 2).
    ("dp4xep2-zero3", 4, ["parallel.ep=2", ZERO + "3"]),
    ("ep2-on-dp2xtp2+sp-zero3", 4, ["parallel.tp=2", SP, "parallel.ep=2", ZERO + "3"]),
    ("dp2xep2-zero3", 2, ["parallel.ep=2", ZERO + "3"]),
    ("dp4xetp2-zero3", 4, ["parallel.etp=2", ZERO + "3"]),
    ("dp2-zero3", 2, [ZERO + "3"]),
]
# Grouped-query attention with fewer kv heads (2) than the Ulysses degree (4): replicated.
# 2D tensor parallelism (parallel.tp_shape): tp 4 as a 2x2 mesh row- and column-first, with
# sequence parallelism, as 1x4 (C split four ways, heads whole), and composed with dp and pp.
TP2D = ["parallel.tp=4", "parallel.tp_shape=2x2"]
TP2D_LAYOUTS = [
    ("tp4-2x2-row", 4, TP2D),
    ("tp4-2x2-column+sp", 4, TP2D + ["parallel.tp_order=column", SP]),
    ("tp4-1x4+sp", 4, ["parallel.tp=4", "parallel.tp_shape=1x4", SP]),
    ("tp4-2x2-chunks3", 4, TP2D + ["parallel.tp_chunks=3"]),
    ("dp2xtp4-2x2-column+sp", 8, TP2D + ["parallel.tp_order=column", SP]),
    # W gathers the kept rows of the row-parallel GEMMs' output gradients over 2D's hidden
    # groups (the pipeline's transfers are the 1D layouts' whatever the schedule).
    ("pp2xtp4-2x2-column+sp-zb-h1", 8, TP2D + ["parallel.tp_order=column", SP, "parallel.pp=2",
                                               "parallel.pp_schedule=zb-h1", "model.n_layer=4"]),
    ("dp2xtp2-1x2-zero3", 4, ["parallel.tp=2", "parallel.tp_shape=1x2", ZERO + "3"]),
    ("cp2xtp2-1x2+sp-ring", 4, ["parallel.tp=2", "parallel.tp_shape=1x2", SP, "parallel.cp=2",
                                RING]),
]
# The second family takes the shapes only (its gate, grouped-query heads and bias-free
# layers); the compositions with dp, pp, ZeRO and cp run the same code for both families.
TP2D_SHAPE_LAYOUTS = TP2D_LAYOUTS[:4]
# MoE: the dense layers and shared experts in 2D, the routed experts folded over the same ranks.
TP2D_MOE_LAYOUTS = [
    ("ep4-on-tp4-2x2-column+sp", 4, TP2D + ["parallel.tp_order=column", SP, "parallel.ep=4"]),
]
TP2D_BROKEN = [
    ("tp4-2x2 missing the attention output gradient's d2 sum", 4, TP2D,
     "tp2d-skip-hidden-grad-sum"),
]
CONTEXT_GQA = ("cp4-ulysses-kv2", 4, ["parallel.cp=4", ULYSSES, "model.n_kv_head=2"])
# Gradients that are zero in exact arithmetic (softmax ignores a constant added to every
# score of a row, so the key bias never matters): their computed value is rounding noise,
# compared against the whole model's gradient norm, and Adam turns it into drift of up
# to lr per step. They cannot change any loss; the test only checks they stay within that.
NOISE_ONLY = (".attn.k.bias",)
# Deliberately broken layouts the checks must catch: (name, ranks, overrides, bug).
BROKEN = [
    ("dp2 missing a bucket's all-reduce", 2, ["parallel.tp=1"], "dp-skip-last-bucket"),
    ("dp2xtp2+sp missing the norms' tp sum", 4,
     ["parallel.tp=2", "parallel.sequence_parallel=true"], "sp-skip-norm-grads"),
]
CONTEXT_BROKEN = [
    ("cp2-ring dropping the remote dK/dV", 2, ["parallel.cp=2", RING], "cp-drop-remote-dkv"),
]
ZERO_BROKEN = [
    ("dp2-zero1 missing a bucket's parameter all-gather", 2, ["parallel.tp=1", ZERO + "1"],
     "zero-skip-gather"),
    ("dp2-zero3 keeping units gathered before the update", 2, ["parallel.tp=1", ZERO + "3"],
     "zero3-keep-stale"),
]
MOE_ZERO_BROKEN = [
    ("dp4xep2-zero1 missing the experts' parameter all-gather", 4,
     ["parallel.ep=2", ZERO + "1"], "zero-moe-skip-expert-gather"),
    ("dp4xep2-zero3 never gathering the experts' units", 4, ["parallel.ep=2", ZERO + "3"],
     "zero3-moe-skip-expert-gather"),
    ("dp4xep2-zero3 keeping the experts' units gathered across updates", 4,
     ["parallel.ep=2", ZERO + "3"], "zero3-moe-stale-experts"),
]
MOE_BROKEN = [
    ("dp4xep2 missing the experts' edp all-reduce", 4, ["parallel.ep=2"], "moe-skip-edp-reduce"),
]


def run(pentad, recipe, work, name, ranks, overrides, bug=None):
    out = work / name
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), pentad, "train", recipe,
           "--dump-weights", str(out / "weights"), "--dump-grads", str(out / "grads")]
    for o in overrides + [f"train.out_dir={out}", f"train.steps={STEPS}", "train.eval_every=0",
                          "train.threads=1", "data.source=random"]:
        cmd += ["--set", o]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    if bug:
        env["PENTAD_INJECT_BUG"] = bug
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 and bug and REFUSAL in proc.stderr:
        # ZeRO's sparse arenas turn a planted read of an ungathered unit into this refusal.
        line = next(l for l in proc.stderr.splitlines() if REFUSAL in l)
        return Refused(line.strip())
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        raise SystemExit(f"{name}: pentad failed ({proc.returncode})")
    steps = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()
             if '"loss"' in l]
    # MoE: every step's routing over the global batch (picks per expert and layer, the
    # fraction dropped), integers that do not depend on the layout unless a pick flips.
    routing = [[(l["tokens"], l["dropped_fraction"]) for l in s.get("moe_layers", [])]
               for s in steps]
    return Run(np.array([s["loss"] for s in steps], dtype=np.float64),
               sum(s["lr"] for s in steps), load_weights(out / "grads"),
               load_weights(out / "weights"), routing)


# What pentad says when the model uses a ZeRO-3 unit's values outside its gather.
REFUSAL = "was used outside its unit"


class Refused:
    def __init__(self, why):
        self.why = why


class Run:
    def __init__(self, losses, lr_sum, grads, weights, routing):
        self.losses, self.lr_sum, self.grads, self.weights = losses, lr_sum, grads, weights
        self.routing = routing


def routing_flip(run, ref):
    """The first step (1-based) whose routing differs from ref's, and how many picks moved
    in its first differing layer (later layers of that step follow from it); (0, 0) when
    the routing is the same throughout."""
    for step, (a, b) in enumerate(zip(run.routing, ref.routing), start=1):
        for la, lb in zip(a, b):
            if la != lb:
                moved = sum(abs(x - y) for x, y in zip(la[0], lb[0])) / 2
                return step, moved + (la[1] != lb[1])
    return 0, 0


def rel(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def compare(run, ref, adam_fraction=ADAM_FRACTION):
    """(the reasons `run` does not train like `ref`, worst loss error, worst tensors)."""
    problems = []
    if isinstance(run, Refused):
        return [f"pentad refused: {run.why}"], np.inf, {}
    if len(run.losses) != len(ref.losses):
        return [f"{len(run.losses)} losses, want {len(ref.losses)}"], np.inf, {}
    # A routing flip (MoE, see the docstring) at step f: a near-tie decided the other way,
    # after which the runs are two different trainings. Allowed only after step 1 (whose
    # gradients are still checked) and as a couple of picks; losses are compared before f,
    # weights not at all.
    flip, moved = routing_flip(run, ref)
    if flip:
        print(f"    routing flipped at step {flip} ({moved:g} picks): a near-tie; losses "
              f"compared before it, final weights not compared")
        if flip == 1 or moved > 2:
            problems.append(f"routing differs at step {flip} by {moved:g} picks (a tie "
                            f"flips one or two; step 1 must route alike)")
    steps = flip - 1 if flip else len(ref.losses)
    loss_errs = np.abs(run.losses[:steps] - ref.losses[:steps]) / np.abs(ref.losses[:steps])
    if steps == 0:
        loss_errs = np.zeros(1)
    if loss_errs.max() > TOL:
        problems.append(f"loss at step {int(np.argmax(loss_errs)) + 1} differs by "
                        f"{loss_errs.max():.2e} relative")
    global_norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in ref.grads.values()))
    worst = {"grad": (0.0, ""), "weight": (0.0, "")}
    for pname, g_ref in ref.grads.items():
        g = run.grads[pname]
        if pname.endswith(NOISE_ONLY):
            err = np.linalg.norm((g - g_ref).astype(np.float64)) / global_norm
        else:
            err = rel(g, g_ref)
        if err > TOL:
            problems.append(f"step-1 gradient of {pname} differs by {err:.2e} relative")
        worst["grad"] = max(worst["grad"], (err, pname))
    for pname, w_ref in ref.weights.items() if not flip else []:
        w = run.weights[pname]
        adam_reach = ref.lr_sum * np.sqrt(w_ref.size)  # how far Adam can move the tensor
        if pname.endswith(NOISE_ONLY):
            if np.abs(w).max() > 1.01 * ref.lr_sum:
                problems.append(f"{pname} moved more than lr per step")
            continue
        diff = np.linalg.norm((w - w_ref).astype(np.float64))
        allowed = max(TOL * np.linalg.norm(w_ref.astype(np.float64)), adam_fraction * adam_reach)
        if diff > allowed:
            problems.append(f"weights of {pname} differ by {diff / adam_reach:.2e} of Adam's "
                            f"reach after {len(ref.losses)} steps (allowed "
                            f"{allowed / adam_reach:.2e})")
        worst["weight"] = max(worst["weight"], (diff / allowed, pname))
    return problems, loss_errs.max(), worst


def degree(overrides, key):
    found = [o for o in overrides if o.startswith(f"parallel.{key}=")]
    return int(found[0].split("=")[1]) if found else 1


# ctest's SKIP_RETURN_CODE for the Haswell variant where it would repeat the native run.
SKIPPED = 77
# OpenBLAS core types whose single-precision kernels are Haswell's own: on such a CPU (AVX2
# without AVX-512) OPENBLAS_CORETYPE=Haswell changes nothing (the variants printed the same
# figures for all 12 layout tests on a Zen CPU).
HASWELL_KERNELS = ("Haswell", "Zen")


def openblas_core(pentad):
    """The core type pentad runs OpenBLAS with on this CPU by itself (the last OpenBLAS names:
    pentad may replace its choice, kernels/cpu/blas_core.h)."""
    found = blas_core.cores([pentad, "--help"])[0]
    return found[-1] if found else "unknown"


def main():
    args = sys.argv[1:]
    blocks_only = args[0] == "--pipeline-blocks"
    pipeline = args[0] == "--pipeline" or blocks_only
    moe = args[0] == "--moe"
    context = args[0] == "--context"
    zero = args[0] == "--zero"
    moe_zero = args[0] == "--moe-zero"
    tp2d = args[0] in ("--tp2d", "--tp2d-shapes", "--tp2d-moe")
    tp2d_shapes = args[0] == "--tp2d-shapes"
    tp2d_moe = args[0] == "--tp2d-moe"
    if pipeline or moe or context or zero or moe_zero or tp2d:
        args = args[1:]
    pentad, recipe, work = args[0], args[1], Path(args[2])
    haswell = os.environ.get("OPENBLAS_CORETYPE") == "Haswell"
    if haswell:
        core = openblas_core(pentad)
        if core in HASWELL_KERNELS:
            print(f"skipped: OpenBLAS picks {core} here, whose kernels are Haswell's: the "
                  "native variant already ran this check")
            sys.exit(SKIPPED)
    common = args[3:] + (PIPELINE_COMMON if pipeline else [])
    accum = PIPELINE_ACCUM if pipeline else ACCUM
    work.mkdir(parents=True, exist_ok=True)
    baselines = {}

    def baseline(dp, overrides):
        """One rank on the global batch of dp ranks, with the layout's non-parallel keys."""
        same = [o for o in overrides if not o.startswith("parallel.")]
        key = (dp, tuple(same))
        if key not in baselines:
            tag = "".join("-" + o.split(".")[-1].replace("=", "") for o in same)
            baselines[key] = run(pentad, recipe, work, f"one-rank-accum{accum * dp}{tag}", 1,
                                 common + same + [f"train.grad_accum={accum * dp}"])
        return baselines[key]

    def dp_of(ranks, overrides):
        return ranks // (degree(overrides, "tp") * degree(overrides, "pp") *
                         degree(overrides, "cp"))

    failures = []
    layouts = (PIPELINE_LAYOUTS if pipeline else MOE_LAYOUTS if moe else
               CONTEXT_LAYOUTS if context else ZERO_LAYOUTS if zero else
               MOE_ZERO_LAYOUTS if moe_zero else TP2D_MOE_LAYOUTS if tp2d_moe else
               TP2D_SHAPE_LAYOUTS if tp2d_shapes else TP2D_LAYOUTS if tp2d else LAYOUTS)
    if context and any(o.startswith("model.n_kv_head=") for o in common):
        layouts = layouts + [CONTEXT_GQA]
    if blocks_only:
        layouts = [l for l in layouts if l[0] in PIPELINE_BLOCK_LAYOUTS]
        assert len(layouts) == len(PIPELINE_BLOCK_LAYOUTS), "a --pipeline-blocks row is gone"
    if os.environ.get("LAYOUTS_ONLY"):  # a developer's subset: names matching this regex
        layouts = [l for l in layouts if re.search(os.environ["LAYOUTS_ONLY"], l[0])]
    # MoE with ZeRO: each layout also stops after its first step, whose weights are compared
    # before any routing near-tie can flip (after one, the final weights are not compared). A
    # replica of the experts whose other shares were not all-gathered over edp differs there
    # by a good part of Adam's step, but moves the losses by less than 1e-5 before it flips
    # a pick itself (at step 2 or 3, in both MoE recipes).
    lengths = [[], ["train.stop_at=1"]] if moe_zero else [[]]
    for (name, ranks, overrides), stop in ((l, s) for l in layouts for s in lengths):
        overrides = overrides + stop
        name += "-step1" if stop else ""
        ref = baseline(dp_of(ranks, overrides), overrides)
        got = run(pentad, recipe, work, name, ranks,
                  common + overrides + [f"train.grad_accum={accum}"])
        problems, loss_err, worst = compare(got, ref,
                                            STEP1_ADAM_FRACTION if stop else ADAM_FRACTION)
        print(f"{name:>20} on {ranks} ranks: worst loss rel {loss_err:.2e}, step-1 gradient "
              f"rel {worst['grad'][0]:.2e} ({worst['grad'][1]}), weights "
              f"{worst['weight'][0]:.2f} of allowed ({worst['weight'][1]}) "
              f"{'FAIL' if problems else 'ok'}")
        for p in problems:
            print(f"    {p}")
        if problems:
            failures.append(name)
    # The checks must catch real layout bugs: each broken variant has to fail. That is the
    # comparison's power, the same whatever OpenBLAS's kernels: the Haswell variant skips it.
    if not pipeline and not haswell:
        broken = (MOE_BROKEN if moe else CONTEXT_BROKEN if context else ZERO_BROKEN if zero
                  else MOE_ZERO_BROKEN if moe_zero else [] if tp2d_moe else TP2D_BROKEN if tp2d
                  else BROKEN)
        for name, ranks, overrides, bug in broken:
            problems = []
            for stop in lengths:
                ref = baseline(dp_of(ranks, overrides + stop), overrides + stop)
                got = run(pentad, recipe, work, "broken-" + bug + ("-step1" if stop else ""),
                          ranks, common + overrides + stop + [f"train.grad_accum={accum}"],
                          bug=bug)
                problems += compare(got, ref,
                                    STEP1_ADAM_FRACTION if stop else ADAM_FRACTION)[0]
            print(f"{'broken: ' + name:>20}: {'caught' if problems else 'NOT CAUGHT'}"
                  + (f" ({problems[0]}; {len(problems)} problems)" if problems else ""))
            if not problems:
                failures.append(f"broken layout not caught: {name}")
    if failures:
        print("FAILED:", ", ".join(failures))
        sys.exit(1)
    print("every layout matches one rank")


if __name__ == "__main__":
    main()
