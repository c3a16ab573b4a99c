#!/usr/bin/env python3
"""Decoding speed: `pentad generate` with its key/value cache, with --no-cache (a full forward
of the context per token), and transformers' generate(use_cache=True) on the same weights.

A GPT-2 124M-shaped model (recipes/gpt2-124m.toml: 12 layers, width 768, 12 heads, vocabulary
50257) is trained one step on random tokens and saved, then exported with `ckpt convert --to
hf`. Each run continues the same 64-token prompt greedily by 128 tokens on THREADS threads
(pentad: OMP_NUM_THREADS; PyTorch: torch.set_num_threads). The runs alternate (pentad cached,
transformers, pentad --no-cache, ...) REPEATS times after one warm-up of each; the figures are
tokens/s of the generating loop, prompt (prefill) included, checkpoint loading excluded:
pentad's own "tokens/s" line, and the wall time of model.generate() for transformers.
model.max_seq_len is CONTEXT (default 192 = 64 + 128; 1024 in the recipe): --no-cache pads
every step's forward to the whole context, so its cost grows with CONTEXT, the cache's does not.

usage: .venv/bin/python bench/generate_speed.py PENTAD WORKDIR [--repeats 3] [--threads 2]
       [--context 192] [--no-cache-tokens 128]
"""
import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

os.environ["HF_HUB_OFFLINE"] = "1"
from transformers import AutoModelForCausalLM  # noqa: E402

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "gpt2-124m.toml"
PROMPT_TOKENS, NEW_TOKENS = 64, 128


def run(cmd, env):
    cmd = [str(c) for c in cmd]
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=env).stdout


def make_checkpoint(pentad, work, context, env):
    ckpt_dir = work / "ckpt"
    if not sorted(ckpt_dir.glob("step-*")):
        sets = ["data.source=random", "train.micro_batch=1", "train.seq_len=64", "train.steps=1",
                "train.save_every=1", "train.eval_every=0", "optim.warmup_steps=1",
                f"model.max_seq_len={context}", f"train.ckpt_dir={ckpt_dir}",
                f"train.out_dir={work / 'run'}"]
        run([pentad, "train", RECIPE, *[a for s in sets for a in ("--set", s)]], env)
    ckpt = sorted(ckpt_dir.glob("step-*"))[-1]
    hf = work / "hf"
    if not (hf / "config.json").exists():
        run([pentad, "ckpt", "convert", "--to", "hf", ckpt, hf], env)
    return ckpt, hf


def pentad_run(pentad, ckpt, prompt, new_tokens, env, *extra):
    out = run([pentad, "generate", ckpt, "--prompt-ids", ",".join(map(str, prompt)),
               "--print-ids", "--max-tokens", new_tokens, *extra], env).strip().splitlines()
    m = re.search(r"(\d+) tokens in ([\d.]+) s: ([\d.]+) tokens/s", out[-1])
    if not m or int(m.group(1)) != new_tokens:
        sys.exit(f"unexpected generate output: {out[-3:]}")
    return float(m.group(3)), [int(x) for x in out[-2].split(",")]


def torch_run(model, prompt):
    ids = torch.tensor([prompt])
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, do_sample=False, use_cache=True, max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, pad_token_id=0,
                             attention_mask=torch.ones_like(ids))
    seconds = time.perf_counter() - start
    return NEW_TOKENS / seconds, out[0, len(prompt):].tolist()


def summary(name, values):
    med = statistics.median(values)
    spread = (max(values) - min(values)) / med * 100
    print(f"{name:28s} median {med:8.2f} tokens/s  (runs {', '.join(f'{v:.2f}' for v in values)};"
          f" spread {spread:.0f}% of the median)")
    return med


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pentad")
    ap.add_argument("work", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=PROMPT_TOKENS + NEW_TOKENS)
    ap.add_argument("--no-cache-tokens", type=int, default=NEW_TOKENS,
                    help="tokens of each --no-cache run (its cost per token does not depend on "
                         "the position: every step is a forward of the whole context)")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))
    torch.set_num_threads(a.threads)
    ckpt, hf = make_checkpoint(a.pentad, a.work, a.context, env)
    model = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    model.generation_config.eos_token_id = None
    rng = random.Random(0)
    prompt = [rng.randrange(50257) for _ in range(PROMPT_TOKENS)]

    pentad_run(a.pentad, ckpt, prompt, 8, env)  # warm-ups (page cache, libraries)
    torch_run(model, prompt)
    cached, uncached, theirs = [], [], []
    for r in range(a.repeats):
        speed, ours = pentad_run(a.pentad, ckpt, prompt, NEW_TOKENS, env)
        cached.append(speed)
        speed, ref = torch_run(model, prompt)
        theirs.append(speed)
        speed, _ = pentad_run(a.pentad, ckpt, prompt, a.no_cache_tokens, env, "--no-cache")
        uncached.append(speed)
        same = sum(x == y for x, y in zip(ours, ref))
        print(f"repeat {r + 1}: pentad {cached[-1]:.2f}, transformers {theirs[-1]:.2f}, "
              f"pentad --no-cache {uncached[-1]:.2f} tokens/s; greedy ids equal to "
              f"transformers' at {same} of {NEW_TOKENS} positions "
              f"(first difference: {next((i for i, (x, y) in enumerate(zip(ours, ref)) if x != y), None)})",
              flush=True)
    print(f"GPT-2 124M shape, context {a.context}, prompt {PROMPT_TOKENS}, {NEW_TOKENS} new tokens,"
          f" {a.threads} threads, {a.repeats} repeats")
    c = summary("pentad (key/value cache)", cached)
    t = summary("transformers use_cache=True", theirs)
    u = summary(f"pentad --no-cache ({a.no_cache_tokens} tok)", uncached)
    print(f"pentad cached / transformers: {c / t:.2f}x; cached / --no-cache: {c / u:.1f}x "
          "(medians)")
    # Paired ratios: each repeat's runs follow one another, so they share the machine's load.
    vs_torch = [x / y for x, y in zip(cached, theirs)]
    vs_full = [x / y for x, y in zip(cached, uncached)]
    print(f"per repeat, cached / transformers: {', '.join(f'{r:.2f}' for r in vs_torch)} "
          f"(median {statistics.median(vs_torch):.2f}x); cached / --no-cache: "
          f"{', '.join(f'{r:.1f}' for r in vs_full)} (median {statistics.median(vs_full):.1f}x)")


if __name__ == "__main__":
    main()
