#!/usr/bin/env python3
"""`pentad generate` checked against transformers' greedy generate on the same weights.

For each NAME (gpt2, llama-gqa, mixtral): `pentad train` a few steps (random tokens, so the model has
learned something but no tokenizer is needed), export the checkpoint with `ckpt convert
--to hf`, then greedy-decode the same prompt ids with `pentad generate --print-ids` and with
transformers' generate(do_sample=False) (both with their key/value caches): the new ids
must be equal, token for token, and `pentad generate --no-cache` (a full forward per token)
must give them too.
With "sample": train.sample_every = STEPS logs the same ids as `pentad generate` from
that step's checkpoint (start: the end-of-text id, V - 1 without a tokenizer), the losses
are those of the same run without it, and under tp2 the key is refused naming the layout.
With "tp2" also given, the gpt2 run is repeated under mpirun -np 2 with parallel.tp=2 and
its checkpoint must generate the same ids as its one-rank twin.

usage: generate_hf.py PENTAD RECIPES_DIR WORKDIR NAME [NAME ...]
Prints "pentad generate matches transformers" on success.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # local directories only: never look for a hub
from transformers import AutoModelForCausalLM  # noqa: E402

STEPS = 2  # few: a model that has not yet collapsed onto one token tests more
NEW_TOKENS = 24
PROMPT = [5, 17, 3, 99, 42, 7]
COMMON = ["data.source=random", "train.micro_batch=2", "train.seq_len=32", "train.threads=2",
          "train.eval_every=0", "optim.warmup_steps=1", f"train.steps={STEPS}",
          f"train.save_every={STEPS}"]
CASES = {
    "gpt2": ("gpt-tiny.toml", []),
    "llama-gqa": ("llama-tiny.toml", ["model.n_kv_head=2", "model.tie_embeddings=false"]),
    "mixtral": ("mixtral-tiny.toml", []),  # GQA, 8 experts, top 2 (MixtralForCausalLM)
}
MPI = ["mpirun", "--oversubscribe", "-np", "2"]


def run(*cmd, env=None):
    cmd = [str(c) for c in cmd]
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=env).stdout


def train(pentad, recipe, work, overrides, ranks=1, log=None):
    sets = [a for o in COMMON + overrides for a in ("--set", o)]
    launcher = MPI if ranks > 1 else []
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = run(*launcher, pentad, "train", recipe, *sets, "--set",
              f"train.ckpt_dir={work / 'ckpt'}", "--set", f"train.out_dir={work / 'run'}", env=env)
    if log is not None:
        log.extend(out.splitlines())
    steps = sorted((work / "ckpt").glob("step-*"))
    if not steps:
        sys.exit(f"no checkpoint under {work / 'ckpt'}")
    return steps[-1]


def pentad_ids(pentad, ckpt, prompt=PROMPT, new_tokens=NEW_TOKENS, *extra):
    out = run(pentad, "generate", ckpt, "--prompt-ids", ",".join(map(str, prompt)),
              "--print-ids", "--max-tokens", new_tokens, *extra).strip().splitlines()
    if "tokens/s" not in out[-1]:
        sys.exit(f"generate printed no tokens/s line: {out}")
    return [int(x) for x in out[-2].split(",")]


def hf_ids(pentad, ckpt, out):
    run(pentad, "ckpt", "convert", "--to", "hf", ckpt, out)
    model = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32,
                                                 attn_implementation="eager")
    model.generation_config.eos_token_id = None  # pentad's --prompt-ids run has no end token
    with torch.no_grad():
        ids = model.generate(torch.tensor([PROMPT]), do_sample=False, use_cache=True,
                             max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, pad_token_id=0,
                             attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long))
    return ids[0, len(PROMPT):].tolist()


def check_sample(pentad, recipe, work):
    failures = []
    with_log, without_log = [], []
    ckpt = train(pentad, recipe, work / "with", [f"train.sample_every={STEPS}"], log=with_log)
    train(pentad, recipe, work / "without", [], log=without_log)
    losses = [[line.split("| loss ")[1].split()[0] for line in lines if "| loss " in line]
              for lines in (with_log, without_log)]
    if not losses[0] or losses[0] != losses[1]:
        failures.append(f"sample_every changed the losses: {losses[0]} != {losses[1]}")
    samples = [line for line in with_log if f"step {STEPS} sample (ids): " in line]
    if len(samples) != 1:
        return failures + [f"expected one step-{STEPS} sample line, got {samples}"]
    logged = [int(x) for x in samples[0].split("sample (ids): ")[1].split()]
    vocab = 512  # gpt-tiny's model.vocab_size; the sample starts at V - 1 without a tokenizer
    generated = pentad_ids(pentad, ckpt, [vocab - 1], len(logged))
    print(f"sample: logged {logged}\nsample: generate {generated}")
    if logged != generated:
        failures.append(f"sample {logged} != pentad generate {generated}")
    try:
        train(pentad, recipe, work / "tp2", [f"train.sample_every={STEPS}", "parallel.tp=2"], 2)
        failures.append("train.sample_every under tp2 was not refused")
    except subprocess.CalledProcessError as e:
        if "train.sample_every" not in e.stdout or "tp = 2" not in e.stdout:
            failures.append(f"tp2 refusal does not name the key and layout: {e.stdout[-400:]}")
    return failures


def main():
    pentad, recipes, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    names = sys.argv[4:]
    shutil.rmtree(work, ignore_errors=True)
    failures = []
    ours = {}
    for name in [n for n in names if n in CASES]:
        recipe_file, extra = CASES[name]
        ckpt = train(pentad, recipes / recipe_file, work / name, extra)
        ours[name] = pentad_ids(pentad, ckpt)
        uncached = pentad_ids(pentad, ckpt, PROMPT, NEW_TOKENS, "--no-cache")
        theirs = hf_ids(pentad, ckpt, work / name / "hf")
        print(f"{name}: pentad {ours[name]}\n{name}: pentad --no-cache {uncached}\n"
              f"{name}: transformers {theirs}")
        if ours[name] != theirs:
            failures.append(f"{name}: pentad {ours[name]} != transformers {theirs}")
        if ours[name] != uncached:
            failures.append(f"{name}: pentad {ours[name]} != pentad --no-cache {uncached}")
    if ours:  # bf16 is a GPU's: refused on the CPU, naming the option to add
        try:
            run(pentad, "generate", ckpt, "--prompt-ids", "1", "--precision", "bf16")
            failures.append("generate --precision bf16 without --device cuda was not refused")
        except subprocess.CalledProcessError as e:
            if "--device cuda" not in e.stdout:
                failures.append(f"bf16 refusal does not name --device cuda: {e.stdout[-400:]}")
    if "tp2" in names:
        ckpt = train(pentad, recipes / CASES["gpt2"][0], work / "gpt2-tp2", ["parallel.tp=2"], 2)
        ids = pentad_ids(pentad, ckpt)
        print(f"gpt2 tp2: pentad {ids}")
        if ids != ours.get("gpt2"):
            failures.append(f"gpt2 tp2 checkpoint: {ids} != one-rank twin {ours.get('gpt2')}")
    if "sample" in names:
        failures += check_sample(pentad, recipes / CASES["gpt2"][0], work / "sample")
    if failures:
        sys.exit("\n".join(failures))
    print("pentad generate matches transformers")


if __name__ == "__main__":
    main()
