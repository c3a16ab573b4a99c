#!/usr/bin/env python3
"""Inputs pentad must accept or refuse: the table below is the specification.

Each row runs the real binary on tiny settings: a recipe (a file of recipes/ or text
written for the case), overrides, optionally under mpirun, and states the exit code and
words the output must hold. Two rows run at a time (the test runs alone: one a core). Refusals must name the key or file to change, and come fast:
a memory plan that cannot fit is refused before anything large is allocated.

usage: cli_inputs.py PENTAD RECIPES_DIR WORKDIR
"""
import os
import shutil
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1")
SECONDS = 5.0  # per case; refusals take well under one (MPI start-up is most of it)
TINY = ["train.steps=2", "train.threads=1", "train.log_every=1", "train.micro_batch=2",
        "train.seq_len=16", "data.source=random"]
SECTIONS = "sections are [model], [moe], [optim], [train], [data], [parallel], [checkpoint]"
SMALL = "small.bin"  # an llm.c shard of 400 tokens: 24 windows of 16, 22 for training


def write_llmc_shard(path, count):
    header = [20240520, 1, count] + [0] * 253
    tokens = [(7 * i) % 512 for i in range(count)]
    path.write_bytes(struct.pack(f"<256i{count}H", *header, *tokens))


# name, recipe (a file of recipes/, or {"text": ...}), overrides, ranks, exit code,
# words the output must hold. ranks 0: one process without mpirun.
CASES = [
    # Recipe mistakes (these passed before issue 12; the table keeps them).
    ("typo_in_key", {"text": "[model]\nn_layers = 2\n"}, [], 0, 2,
     ["typo_in_key.toml:2:", "model.n_layers", "did you mean model.n_layer?"]),
    ("unknown_section", {"text": "[modle]\nn_layer = 2\n"}, [], 0, 2,
     ["unknown_section.toml", "unknown section [modle]", "did you mean [model]?", SECTIONS]),
    ("unknown_section_parallel", {"text": "[paralel]\ntp = 1\n"}, [], 0, 2,
     ["unknown section [paralel]", "did you mean [parallel]?", SECTIONS]),
    ("unknown_section_override", "gpt-tiny.toml", ["tran.steps=1"], 0, 2,
     ["override 'tran.steps=1'", "did you mean [train]?", SECTIONS]),
    ("negative_lr", "gpt-tiny.toml", ["optim.lr=-1e-3"], 0, 2, ["optim.lr must be >= 0"]),
    ("val_fraction_one", "gpt-tiny.toml", ["data.val_fraction=1.0"], 0, 2,
     ["data.val_fraction must be in [0, 1)"]),
    # An empty recipe would train on the defaults of every key.
    ("empty_recipe", {"text": ""}, [], 0, 2,
     ["empty_recipe.toml", "sets no key", "the file is empty"]),
    ("comments_only_recipe", {"text": "# gpt-tiny, one day\n\n[model]\n"}, [], 0, 2,
     ["comments_only_recipe.toml", "sets no key", "only comments or empty sections"]),
    # Meaningful values that used to be refused.
    ("lr_zero", "gpt-tiny.toml", TINY + ["optim.lr=0"], 0, 0, ["step     2/2", "lr 0.00e+00"]),
    ("val_fraction_zero", "gpt-tiny.toml",
     ["train.steps=2", "train.threads=1", "train.micro_batch=2", "train.seq_len=16",
      "train.eval_every=1", "data.source=llmc", f"data.path={SMALL}", "data.val_fraction=0"],
     0, 0, ["val 0 tokens", "eval: off, there is no validation data", "step     2/2"]),
    # Small data: the log says how many epochs the run reads.
    ("small_data_epochs", "gpt-tiny.toml",
     ["train.steps=10", "train.threads=1", "train.micro_batch=4", "train.grad_accum=2",
      "train.seq_len=16", "train.eval_every=0", "data.source=llmc", f"data.path={SMALL}"],
     0, 0, ["10 steps x 8 samples = 3.64 epochs over the 22 training samples (windows repeat)"]),
    ("data_below_one_batch", "gpt-tiny.toml",
     ["train.steps=1", "train.threads=1", "train.micro_batch=32", "train.seq_len=16",
      "train.eval_every=0", "data.source=llmc", f"data.path={SMALL}"],
     0, 0, ["fewer than one global batch: windows repeat within each step"]),
    ("large_data_one_pass", "gpt-tiny.toml", TINY + ["train.eval_every=0"], 0, 0,
     ["2 steps x 2 samples = ", "epochs over the"]),
    # Memory plans that cannot fit: refused at once, naming the items and the keys.
    ("layers_100000", "gpt-tiny.toml", ["model.n_layer=100000", "train.steps=0"], 0, 2,
     ["gpt-tiny.toml", "memory plan does not fit", "activations", "AdamW state",
      "model.n_layer <=", "parallel.tp x parallel.pp"]),
    ("layers_10000", "gpt-tiny.toml",
     ["model.n_layer=10000", "train.steps=0", "train.memory_limit_mb=20000"], 0, 2,
     ["memory plan does not fit", "above train.memory_limit_mb = 20000", "model.n_layer <=",
      "model.recompute = true", "raise train.memory_limit_mb"]),
    ("huge_d_model", "gpt-tiny.toml", ["model.d_model=1000000000", "model.n_head=1"], 0, 2,
     ["memory plan does not fit", "EiB", "parameters", "model.d_model <="]),
    ("huge_vocab", "gpt-tiny.toml", ["model.vocab_size=10000000000"], 0, 2,
     ["memory plan does not fit", "TiB", "model.vocab_size <="]),
    ("huge_micro_batch", "gpt-tiny.toml",
     ["train.micro_batch=100000", "train.memory_limit_mb=1024"], 0, 2,
     ["memory plan does not fit", "activations", "train.micro_batch <="]),
    # Issue 45: ZeRO over more ranks and recompute are named even where neither fits alone.
    ("layers_10000_state_bound", "gpt-tiny.toml",
     ["model.n_layer=10000", "train.steps=0", "train.micro_batch=2", "train.seq_len=16",
      "train.memory_limit_mb=7000"], 0, 2,
     ["model.recompute = true (recomputes", "not enough alone",
      "parallel.zero = 2 over 2 data-parallel ranks"]),
    # Issue 45: pp = 4 on 6 ranks named parallel.tp, which the recipe left at 1.
    ("pp_not_dividing_the_ranks", "gpt-tiny.toml", ["parallel.pp=4"], 6, 2,
     ["does not divide the 6 ranks started: change parallel.pp to 1, 2, 3 or 6"]),
    ("memory_limit_tiny", "gpt-tiny.toml", ["train.memory_limit_mb=1"], 0, 2,
     ["above train.memory_limit_mb = 1"]),
    ("memory_limit_negative", "gpt-tiny.toml", ["train.memory_limit_mb=-1"], 0, 2,
     ["train.memory_limit_mb must be >= 0"]),
    ("memory_limit_fits", "gpt-tiny.toml", TINY + ["train.memory_limit_mb=64"], 0, 0,
     ["memory plan (this rank"]),
    ("pipeline_stage_over_limit", "gpt-tiny.toml",
     ["parallel.pp=2", "model.n_layer=4000", "train.memory_limit_mb=512"], 2, 2,
     ["each rank of pipeline stage", "memory plan does not fit"]),
    # Mixture of Experts (issue 14): refusals name the key to change.
    ("moe_experts_without_layers", "mixtral-tiny.toml", ["model.moe_layers="], 0, 2,
     ["override 'model.moe_layers='", "model.n_experts = 8 but model.moe_layers is empty"]),
    ("moe_layers_without_experts", "llama-tiny.toml", ["model.moe_layers=all"], 0, 2,
     ["model.moe_layers = \"all\" but model.n_experts = 0"]),
    ("moe_top_k_above_experts", "mixtral-tiny.toml", ["model.top_k=9"], 0, 2,
     ["model.top_k (9) must be at most model.n_experts (8)"]),
    ("moe_layers_malformed", "mixtral-tiny.toml", ["model.moe_layers=every:two"], 0, 2,
     ["model.moe_layers = \"every:two\"", "is not a layer number", "\"every:N\""]),
    ("moe_layers_past_the_model", "mixtral-tiny.toml", ["model.moe_layers=0,2"], 0, 2,
     ["model.moe_layers = \"0,2\" names layer 2, but model.n_layer = 2"]),
    ("moe_layers_from_past_the_model", "moe-fine-tiny.toml", ["model.moe_layers=from:3"], 0, 2,
     ["model.moe_layers = \"from:3\" names no layer"]),
    ("moe_experts_not_divisible_by_ep", "mixtral-tiny.toml", ["parallel.ep=3"], 0, 2,
     ["model.n_experts (8) must be divisible by parallel.ep (3)"]),
    ("moe_width_not_divisible_by_etp", "mixtral-tiny.toml", ["parallel.etp=3"], 0, 2,
     ["model.d_ff_expert = 128) must be divisible by parallel.etp (3)"]),
    ("moe_shared_width_not_divisible_by_tp", "moe-fine-tiny.toml",
     ["parallel.tp=3", "parallel.sequence_parallel=true", "model.d_model=96", "model.n_head=6",
      "model.n_kv_head=3"], 0, 2,
     ["shared experts' width", "= 32) must be divisible by parallel.tp (3)"]),
    ("moe_ep_etp_not_dividing_the_stage", "mixtral-tiny.toml",
     TINY + ["parallel.ep=2", "parallel.etp=2"], 2, 2,
     ["parallel.ep (2) x parallel.etp (2) = 4 must divide the 2 ranks of a pipeline stage"]),
    ("moe_tp_without_sequence_parallel", "mixtral-tiny.toml", ["parallel.tp=2"], 0, 2,
     ["parallel.tp = 2 need parallel.sequence_parallel = true"]),
    ("moe_capacity_below_one_over_k", "mixtral-tiny.toml", ["moe.capacity_factor=0.25"], 0, 2,
     ["moe.capacity_factor = 0.25 is below 1 / model.top_k = 1 / 2", "or 0 for dropless"]),
    ("moe_ep_on_a_dense_model", "llama-tiny.toml", ["parallel.ep=2"], 0, 2,
     ["parallel.ep = 2", "the model has no MoE layers"]),
    ("moe_shared_experts_on_a_dense_model", "llama-tiny.toml", ["model.n_shared_experts=1"], 0,
     2, ["model.n_shared_experts is set but the model has no MoE layers"]),
    ("moe_trains", "moe-fine-tiny.toml", TINY, 0, 0,
     ["in routed experts", "MoE dispatch buffers up to", "step     2/2", "max/mean load"]),
    ("moe_experts_over_the_limit", "mixtral-tiny.toml",
     ["model.n_experts=20000", "train.memory_limit_mb=256"], 0, 2,
     ["memory plan does not fit", "in routed experts", "MoE dispatch buffers",
      "parallel.ep up to 20000 (now 1)"]),
    # A step whose gradients are not finite updates nothing, up to train.max_skipped_steps.
    ("nan_gradient_skipped", "gpt-tiny.toml", TINY + ["train.inject_nan_grad=1:2"], 2, 0,
     ["step 2: loss", "not finite; nothing updated, the batch dropped (1 of "
      "train.max_skipped_steps = 3)", "step     2/2"]),
    ("nan_gradient_over_the_limit", "gpt-tiny.toml",
     TINY + ["train.inject_nan_grad=0:1", "train.max_skipped_steps=0"], 0, 1,
     ["step 1: loss", "above train.max_skipped_steps = 0: training diverged"]),
    # Fault injections (train.inject_fault): a bad spec names the key and the field.
    ("inject_fault_slowlink_one_rank", "gpt-tiny.toml", TINY + ["train.inject_fault=slowlink:1:1:5"],
     2, 2, ['train.inject_fault = "slowlink:1:1:5": A and B must be two different world ranks']),
    ("inject_fault_bad_field", "gpt-tiny.toml", TINY + ["train.inject_fault=kill:1:x"], 2, 2,
     ['train.inject_fault = "kill:1:x": STEP "x" is not a whole number']),
    ("inject_fault_corrupt_without_saves", "gpt-tiny.toml", TINY + ["train.inject_fault=corrupt:1:5"],
     2, 2, ["corrupts a checkpoint, but train.save_every = 0 saves none"]),
    # Context parallelism: what does not divide, said with the key to change.
    ("cp_ring_seq_len_not_divisible", "llama-tiny.toml",
     ["parallel.cp=4", "parallel.cp_impl=ring", "train.seq_len=36", "parallel.dp=1"], 0, 2,
     ["train.seq_len = 36 must be a multiple of 2 x parallel.cp = 8", "zig-zag"]),
    ("cp_ulysses_heads_do_not_split", "llama-tiny.toml",
     ["parallel.cp=8", "parallel.cp_impl=ulysses", "parallel.dp=1"], 0, 2,
     ["the Ulysses degree 8 does not divide the 4 query heads", "change parallel.cp"]),
    ("cp_ulysses_kv_heads_do_not_split", "llama-tiny.toml",
     ["model.n_head=6", "model.d_model=48", "model.n_kv_head=3", "parallel.cp=2",
      "parallel.cp_impl=ulysses", "parallel.dp=1"], 0, 2,
     ["the Ulysses degree 2 and the 3 kv heads", "must divide one another"]),
    ("cp_hybrid_degree_not_dividing", "llama-tiny.toml",
     ["parallel.cp=4", "parallel.cp_impl=hybrid", "parallel.cp_ulysses=3", "parallel.dp=1"], 0,
     2, ["parallel.cp_ulysses = 3 must divide parallel.cp = 4"]),
    ("cp_ulysses_degree_without_hybrid", "llama-tiny.toml", ["parallel.cp_ulysses=2"], 0, 2,
     ["parallel.cp_ulysses = 2 is the Ulysses degree of parallel.cp_impl = \"hybrid\""]),
    ("longctx_on_one_rank_over_the_limit", "llama-longctx.toml", ["parallel.cp=1"], 0, 2,
     ["memory plan does not fit", "above train.memory_limit_mb = 400", "parallel.cp = 4 (now 1"]),
    ("cp_hybrid_trains", "llama-tiny.toml",
     TINY + ["parallel.cp=4", "parallel.cp_impl=hybrid", "parallel.cp_ulysses=2"], 4, 0,
     ["cp 0/4", "tokens of each sequence here (cp 4 hybrid)", "step     2/2"]),
    # ZeRO and offload: what is not built says so, with the key to change.
    ("zero3_moe_nvme_parameters_trains", "mixtral-tiny.toml",
     TINY + ["parallel.ep=2", "parallel.zero=3", "parallel.offload=nvme",
             "parallel.offload_path=."], 4, 0,
     ["the routed experts over edp = 2", "parameters: none resident", "step     2/2"]),
    ("zero3_moe_trains", "mixtral-tiny.toml", TINY + ["parallel.ep=2", "parallel.zero=3"], 4, 0,
     ["ZeRO-3 over dp x cp = 4, the routed experts over edp = 2",
      "each layer is gathered into a buffer of its own", "step     2/2"]),
    ("zero3_uneven_eval_batches", "gpt-tiny.toml",
     TINY + ["parallel.zero=3", "train.eval_batches=3"], 2, 2,
     ["train.eval_batches (3) must be a multiple of the data-parallel degree (2) with "
      "parallel.zero = 3", "set train.eval_batches = 4"]),
    ("zero2_moe_trains", "mixtral-tiny.toml", TINY + ["parallel.ep=2", "parallel.zero=2"], 4, 0,
     ["ZeRO-2 over dp x cp = 4, the routed experts over edp = 2", "step     2/2"]),
    ("zero_stage_out_of_range", "gpt-tiny.toml", ["parallel.zero=4"], 0, 2, ["parallel.zero"]),
    ("nvme_without_path", "gpt-tiny.toml", ["parallel.offload=nvme"], 0, 2,
     ["parallel.offload = \"nvme\" needs parallel.offload_path"]),
    ("offload_path_without_nvme", "gpt-tiny.toml", ["parallel.offload_path=/tmp"], 0, 2,
     ["parallel.offload_path is set but parallel.offload = \"none\""]),
    ("nvme_with_swap_snapshots", "gpt-tiny.toml",
     ["parallel.offload=nvme", "parallel.offload_path=/tmp", "train.save_every=5",
      "checkpoint.snapshot=swap"], 0, 2,
     ["checkpoint.snapshot = \"swap\" keeps a second set", "set checkpoint.snapshot = \"copy\""]),
    ("cpu_offload_on_cuda_with_swap_snapshots", "gpt-tiny.toml",
     ["parallel.offload=cpu", "train.device=cuda", "train.save_every=5",
      "checkpoint.snapshot=swap"], 0, 2,
     ["AdamW offloaded to the host", "set checkpoint.snapshot = \"copy\""]),
    ("zero3_trains", "gpt-tiny.toml", TINY + ["parallel.zero=3"], 2, 0,
     ["ZeRO-3 over dp x cp = 2", "each layer is gathered into a buffer of its own", "step     2/2"]),
    ("mirror_not_creatable", "gpt-tiny.toml",
     TINY + ["train.save_every=1", "train.ckpt_mirror=/proc/pentad-mirror"], 0, 2,
     ["train.ckpt_mirror = /proc/pentad-mirror: cannot create the checkpoint directory"]),
    ("slowlink_without_named_sends", "gpt-tiny.toml",
     TINY + ["train.inject_fault=slowlink:0:1:1", "parallel.ring_all_reduce=false"], 2, 2,
     ["delays sends between ranks 0 and 1", "keep parallel.ring_all_reduce = true"]),
    # Written after the training: its directory is made (or refused) before the first step.
    ("op_profile_directory_not_creatable", "gpt-tiny.toml",
     TINY + ["--op-profile", "/proc/pentad-op-profile/ops.json"], 0, 2,
     ["--op-profile /proc/pentad-op-profile/ops.json: cannot create the directory "
      "/proc/pentad-op-profile"]),
    # Two pipeline ranks on one core: the bubble comes from the stages' compute time.
    ("bubble_on_one_core", "gpt-tiny.toml",
     TINY + ["parallel.pp=2", "train.grad_accum=4", "train.eval_every=0", "--trace",
             "trace.json"], -2, 0,
     ["from the stages' own compute time", "2 ranks (2 compute threads) share 1 core",
      "not measured by the clock"]),
]


def command(pentad, recipe, overrides, ranks):
    cmd = [pentad, "train", str(recipe), *overrides]
    if ranks == 0:
        return cmd
    mpirun = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(abs(ranks))]
    # ranks < 0: every rank on core 0 alone (the affinity mask the ranks inherit).
    return (["taskset", "-c", "0"] if ranks < 0 else []) + mpirun + cmd


def once_per_job(pentad, recipes, work):
    """A refusal every rank meets is printed once, by rank 0, with no MPI_ABORT notice."""
    run = subprocess.run(command(pentad, recipes / "gpt-tiny.toml",
                                 ["model.n_head=5", f"train.out_dir={work}/once"], 4),
                         cwd=work, env=ENV, capture_output=True, text=True, timeout=60)
    output = run.stdout + run.stderr
    lines = [l for l in output.splitlines() if l.startswith("pentad: error")]
    ok = (run.returncode == 2 and len(lines) == 1 and "model.n_head" in lines[0]
          and "(rank" not in lines[0] and "MPI_ABORT" not in output)
    print(f"{'ok  ' if ok else 'FAIL'} refused_once_on_4_ranks      exit {run.returncode}, "
          f"{len(lines)} error lines")
    if not ok:
        print("     output:\n" + "\n".join("       " + l for l in output.splitlines()[-12:]))
    return [] if ok else ["refused_once_on_4_ranks"]


def usage(pentad, work):
    """Issue 45: --version prints one; usage errors exit 2 like every refusal (not CLI11's
    105 and 106)."""
    cases = [("version", ["--version"], 0, "pentad 0."), ("no_subcommand", [], 2, "subcommand"),
             ("missing_recipe", ["train", "missing.toml"], 2, "missing.toml"),
             ("missing_argument", ["ckpt", "convert", "--to", "hf"], 2, "required")]
    failures = []
    for name, args, code, words in cases:
        run = subprocess.run([pentad, *args], cwd=work, env=ENV, capture_output=True, text=True,
                             timeout=60)
        ok = run.returncode == code and words in run.stdout + run.stderr
        print(f"{'ok  ' if ok else 'FAIL'} usage_{name:22s} exit {run.returncode}")
        if not ok:
            print("     output:\n" + "\n".join(
                "       " + l for l in (run.stdout + run.stderr).splitlines()[-4:]))
            failures.append(f"usage_{name}")
    return failures


def nothing_left(pentad, recipes, work):
    """--resume latest at the run's last step says there is nothing left to train."""
    out = [f"train.out_dir={work}/done", "train.save_every=2"]
    first = subprocess.run(command(pentad, recipes / "gpt-tiny.toml", TINY + out, 0), cwd=work,
                           env=ENV, capture_output=True, text=True, timeout=60)
    again = subprocess.run(command(pentad, recipes / "gpt-tiny.toml",
                                   TINY + out + ["--resume", "latest"], 0),
                           cwd=work, env=ENV, capture_output=True, text=True, timeout=60)
    ok = (first.returncode == 0 and again.returncode == 0 and
          "nothing to train: the run resumed at step 2" in again.stdout + again.stderr)
    print(f"{'ok  ' if ok else 'FAIL'} resume_at_the_last_step      exit {again.returncode}")
    if not ok:
        print("     output:\n" + "\n".join(
            "       " + l for l in (again.stdout + again.stderr).splitlines()[-8:]))
    return [] if ok else ["resume_at_the_last_step"]


def main():
    pentad, recipes, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    write_llmc_shard(work / SMALL, 400)
    failures = []
    def run_case(case):
        name, recipe, overrides, ranks, code, words = case
        if isinstance(recipe, dict):
            path = work / f"{name}.toml"
            path.write_text(recipe["text"])
        else:
            path = recipes / recipe
        args = overrides + [f"train.out_dir=runs/{name}", "data.cache_dir=data"]
        start = time.monotonic()
        try:
            run = subprocess.run(command(pentad, path, args, ranks), cwd=work, env=ENV,
                                 capture_output=True, text=True, timeout=60)
            output, rc = run.stdout + run.stderr, run.returncode
        except subprocess.TimeoutExpired as e:
            output, rc = str(e.stdout or "") + str(e.stderr or ""), "timeout"
        seconds = time.monotonic() - start
        problems = [f"exit {rc}, expected {code}"] if rc != code else []
        problems += [f"missing: {w}" for w in words if w not in output]
        if seconds > SECONDS:
            problems.append(f"took {seconds:.1f} s (limit {SECONDS} s)")
        report = f"{'ok  ' if not problems else 'FAIL'} {name:28s} exit {rc} in {seconds:.2f} s"
        if problems:
            report += "\n     " + "\n     ".join(problems)
            report += "\n     output tail:\n" + "\n".join(
                "       " + l for l in output.splitlines()[-8:])
        return name, problems, report

    # Two cases at a time, one a core (each has its own out_dir; none writes the data cache:
    # the ones that train read random tokens or the llm.c shard written above).
    with ThreadPoolExecutor(max_workers=2) as pool:
        for name, problems, report in pool.map(run_case, CASES):
            print(report)
            if problems:
                failures.append(name)
    failures += once_per_job(pentad, recipes, work) + nothing_left(pentad, recipes, work)
    failures += usage(pentad, work)
    if failures:
        print(f"{len(failures)} of {len(CASES) + 6} cases failed: {', '.join(failures)}")
        sys.exit(1)
    print(f"every input case behaves ({len(CASES)} cases)")


if __name__ == "__main__":
    main()
