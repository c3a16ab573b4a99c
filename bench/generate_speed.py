#!/usr/bin/env python3
"""Decoding speed: `pentad generate` with its key/value cache (and, on the CPU, --no-cache: a
full forward of the context per token) next to transformers' generate(use_cache=True) on the
same weights, prompt and greedy decoding, on the CPU or on a GPU.

A GPT-2 124M-shaped model (recipes/gpt2-124m.toml: 12 layers, width 768, 12 heads) is trained
one step on random tokens on the CPU and saved, then exported with `ckpt convert --to hf`.
Each run continues the same 64-token prompt greedily (--ignore-eos) by NEW tokens. The runs
alternate (pentad, transformers, ...) REPEATS times after one warm-up of each.

Figures, per implementation:
  - "end to end": NEW / the generating loop's time, the prompt's prefill included and checkpoint
    loading excluded: pentad's own "tokens/s" line (its timer starts after loading, so its
    first-call costs fall inside: CUDA module loading, cuBLASLt's plans), and the wall time of
    model.generate() for transformers (warmed up in its process; on a GPU synchronised).
  - "decode": the marginal rate of the cached decode, (NEW - SHORT) / (t(NEW) - t(SHORT)) from a
    second, SHORT-token run in the same repeat: prefill, first-call and start-up costs cancel.
    This is the figure to compare.
Greedy ids: the first CHECK tokens of pentad's fp32 run must equal transformers' fp32 ones
(the script fails otherwise); the measured runs' ids are compared and the first difference
printed (in bf16 two implementations round differently, and a random model's near-ties then
fork the sequences early: not a failure).

On a GPU (--device cuda, bf16 by default) the vocabulary is 50304 (as the GPU benchmark's
GPT-2) and 256 tokens are generated; about a minute on an H200. Without transformers (the GPU
machine may have PyTorch alone) the reference is a GPT-2 with a key/value cache written here in
plain PyTorch over the exported safetensors (--reference torch forces it), and says so.

usage: python3 bench/generate_speed.py PENTAD WORKDIR [--device cpu|cuda] [--precision fp32|bf16]
       [--repeats 3] [--threads 2] [--new-tokens N] [--short-tokens 16] [--check-tokens N]
       [--context N] [--no-cache-tokens N] [--reference auto|transformers|torch]
       [--layers L --width C --heads H --vocab V] [--json PATH]
"""
import argparse
import json
import math
import os
import random
import re
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

from blas_env import same_blas_kernels

same_blas_kernels()  # before torch loads OpenBLAS
import torch
import torch.nn.functional as F

os.environ["HF_HUB_OFFLINE"] = "1"

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "gpt2-124m.toml"
PROMPT_TOKENS = 64


def run(cmd, env):
    cmd = [str(c) for c in cmd]
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{cmd[0]} {cmd[1]} failed ({p.returncode}):\n{p.stdout[-3000:]}")
    return p.stdout


def make_checkpoint(a, env):
    """One CPU training step of the shape, saved, and its Hugging Face export."""
    shape = [f"model.vocab_size={a.vocab}", f"model.max_seq_len={a.context}"]
    if a.layers:
        shape += [f"model.n_layer={a.layers}", f"model.d_model={a.width}", f"model.n_head={a.heads}"]
    tag = "-".join(s.split("=")[1] for s in shape)
    ckpt_dir = a.work / f"ckpt-{tag}"
    if not sorted(ckpt_dir.glob("step-*")):
        sets = shape + ["data.source=random", "train.micro_batch=1", "train.seq_len=64",
                        "train.steps=1", "train.save_every=1", "train.eval_every=0",
                        "optim.warmup_steps=1", f"train.ckpt_dir={ckpt_dir}",
                        f"train.out_dir={a.work / ('run-' + tag)}"]
        run([a.pentad, "train", RECIPE, *[x for s in sets for x in ("--set", s)]], env)
    ckpt = sorted(ckpt_dir.glob("step-*"))[-1]
    hf = a.work / f"hf-{tag}"
    if not (hf / "config.json").exists():
        run([a.pentad, "ckpt", "convert", "--to", "hf", ckpt, hf], env)
    return ckpt, hf


def pentad_run(a, ckpt, prompt, tokens, precision, env, *extra):
    """(tokens/s, seconds of the generating loop, generated ids) of one `pentad generate`."""
    out = run([a.pentad, "generate", ckpt, "--prompt-ids", ",".join(map(str, prompt)),
               "--print-ids", "--ignore-eos", "--max-tokens", tokens, "--device", a.device,
               "--precision", precision, *extra], env).strip().splitlines()
    m = re.search(r"(\d+) tokens in ([\d.]+) s: ([\d.]+) tokens/s", out[-1])
    if not m or int(m.group(1)) != tokens:
        sys.exit(f"unexpected generate output: {out[-3:]}")
    return float(m.group(3)), float(m.group(2)), [int(x) for x in out[-2].split(",")]


# ---- the reference: transformers, or a GPT-2 with a cache in plain PyTorch ----

def read_safetensors(path):
    """{name: tensor} of a safetensors file (8-byte header size, JSON header, raw data)."""
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    blob = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = bytearray(blob[8 + n + begin:8 + n + end])
        out[name] = torch.frombuffer(raw, dtype=dtypes[info["dtype"]]).reshape(info["shape"])
    return out


class TorchGpt2:
    """GPT-2 (Hugging Face's names and Conv1D layouts) decoding from a key/value cache."""

    def __init__(self, hf, dtype, device):
        cfg = json.loads((hf / "config.json").read_text())
        self.L, self.H, self.eps = cfg["n_layer"], cfg["n_head"], cfg["layer_norm_epsilon"]
        files = sorted(hf.glob("*.safetensors"))
        w = {}
        for f in files:
            w.update(read_safetensors(f))
        w = {k.removeprefix("transformer."): v.to(device=device, dtype=dtype) for k, v in w.items()}
        w.setdefault("lm_head.weight", w["wte.weight"])
        self.w, self.dtype, self.device = w, dtype, device

    def _ln(self, x, p):
        return F.layer_norm(x, x.shape[-1:], self.w[p + ".weight"], self.w[p + ".bias"], self.eps)

    def _forward(self, ids, pos0, cache):
        """logits (b, t, V) of ids (b, t) at positions pos0.., appending to cache [(k, v)]."""
        w, b, t = self.w, ids.shape[0], ids.shape[1]
        x = w["wte.weight"][ids] + w["wpe.weight"][pos0:pos0 + t]
        C = x.shape[-1]
        for i in range(self.L):
            p = f"h.{i}."
            h = self._ln(x, p + "ln_1")
            qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
            q, k, v = qkv.view(b, t, 3, self.H, C // self.H).permute(2, 0, 3, 1, 4)
            if i < len(cache):
                k = torch.cat([cache[i][0], k], 2)
                v = torch.cat([cache[i][1], v], 2)
                cache[i] = (k, v)
            else:
                cache.append((k, v))
            # (b, H, t, T) scores; the prefill's rows see keys up to their own position
            s = (q @ k.transpose(-1, -2)).float() / math.sqrt(C // self.H)
            if t > 1:
                T = k.shape[2]
                mask = torch.ones(t, T, dtype=torch.bool, device=x.device).triu(T - t + 1)
                s = s.masked_fill(mask, float("-inf"))
            y = s.softmax(-1).to(v.dtype) @ v
            y = y.transpose(1, 2).reshape(b, t, C)
            x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
            h = self._ln(x, p + "ln_2")
            h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
            x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
        return self._ln(x, "ln_f") @ w["lm_head.weight"].T

    @torch.no_grad()
    def generate(self, prompt, new_tokens):
        ids = torch.tensor([prompt], device=self.device)
        cache, out = [], []
        logits = self._forward(ids, 0, cache)
        for n in range(new_tokens):
            nxt = int(logits[0, -1].float().argmax())
            out.append(nxt)
            if n + 1 < new_tokens:
                logits = self._forward(torch.tensor([[nxt]], device=self.device),
                                       len(prompt) + n, cache)
        return out


def load_reference(a, hf, dtype):
    """(name, generate(prompt, n) -> ids) on a.device in dtype."""
    want = a.reference
    if want in ("auto", "transformers"):
        try:
            from transformers import AutoModelForCausalLM
        except ImportError as e:
            if want == "transformers":
                sys.exit(f"--reference transformers: {e}")
            print(f"transformers is not installed ({e}): the reference is this script's GPT-2 "
                  "with a key/value cache in plain PyTorch", flush=True)
        else:
            model = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=dtype,
                                                         attn_implementation="eager")
            model = model.to(a.device).eval()
            model.generation_config.eos_token_id = None

            @torch.no_grad()
            def generate(prompt, n):
                ids = torch.tensor([prompt], device=a.device)
                out = model.generate(ids, do_sample=False, use_cache=True, max_new_tokens=n,
                                     min_new_tokens=n, pad_token_id=0,
                                     attention_mask=torch.ones_like(ids))
                return out[0, len(prompt):].tolist()
            import transformers
            return f"transformers {transformers.__version__} use_cache=True", generate
    model = TorchGpt2(hf, dtype, a.device)
    return "PyTorch GPT-2 with a cache (this script)", model.generate


def timed(a, generate, prompt, n):
    """(tokens/s, seconds, ids) of one reference run."""
    if a.device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    ids = generate(prompt, n)
    if a.device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return n / seconds, seconds, ids


def first_difference(x, y):
    return next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None)


def summary(name, values, unit="tokens/s"):
    if not values:
        return None
    med = statistics.median(values)
    spread = (max(values) - min(values)) / med * 100 if med else 0.0
    print(f"{name:44s} median {med:9.2f} {unit}  (runs {', '.join(f'{v:.2f}' for v in values)};"
          f" spread {spread:.0f}% of the median)")
    return med


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pentad")
    ap.add_argument("work", type=Path)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default=None,
                    help="default: fp32 on the CPU, bf16 on a GPU")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=None, help="default: 128 CPU, 256 GPU")
    ap.add_argument("--short-tokens", type=int, default=16,
                    help="tokens of the short run the decode rate is taken against (0: none)")
    ap.add_argument("--check-tokens", type=int, default=None,
                    help="fp32 greedy ids that must agree (default: 32; 0: no check)")
    ap.add_argument("--context", type=int, default=None,
                    help="model.max_seq_len (default: prompt + new tokens)")
    ap.add_argument("--no-cache-tokens", type=int, default=None,
                    help="tokens of each --no-cache run (default: 128 on the CPU, 0 (none) on a "
                         "GPU; its cost per token does not depend on the position: every step "
                         "is a forward of the whole context)")
    ap.add_argument("--reference", choices=["auto", "transformers", "torch"], default="auto")
    ap.add_argument("--layers", type=int, default=0, help="a smaller model (with --width, --heads)")
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=None, help="default: 50257 CPU, 50304 GPU")
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args()
    gpu = a.device == "cuda"
    a.precision = a.precision or ("bf16" if gpu else "fp32")
    a.new_tokens = a.new_tokens or (256 if gpu else 128)
    a.check_tokens = 32 if a.check_tokens is None else a.check_tokens
    a.context = a.context or PROMPT_TOKENS + a.new_tokens
    a.vocab = a.vocab or (50304 if gpu else 50257)
    if a.no_cache_tokens is None:
        a.no_cache_tokens = 0 if gpu else 128
    if not 0 <= a.short_tokens < a.new_tokens:
        sys.exit("--short-tokens must be below --new-tokens")
    if gpu and not torch.cuda.is_available():
        sys.exit("--device cuda: PyTorch sees no CUDA device")
    a.work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))
    torch.set_num_threads(a.threads)
    if gpu:  # fp32 means fp32 on both sides (pentad's fp32 uses no TF32)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    ckpt, hf = make_checkpoint(a, env)
    rng = random.Random(0)
    prompt = [rng.randrange(min(a.vocab, 50257)) for _ in range(PROMPT_TOKENS)]
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    result = {"device": a.device, "precision": a.precision, "prompt_tokens": PROMPT_TOKENS,
              "new_tokens": a.new_tokens, "short_tokens": a.short_tokens, "context": a.context,
              "repeats": a.repeats, "vocab": a.vocab,
              "gpu": torch.cuda.get_device_name() if gpu else None}

    # The greedy ids in fp32, where both sides must agree (the bf16 runs may fork).
    if a.check_tokens:
        n = min(a.check_tokens, a.new_tokens)
        name32, ref32 = load_reference(a, hf, torch.float32)
        _, _, ours = pentad_run(a, ckpt, prompt, n, "fp32", env)
        theirs = ref32(prompt, n)
        diff = first_difference(ours, theirs)
        result["fp32_check"] = {"tokens": n, "reference": name32, "first_difference": diff}
        print(f"fp32 greedy ids, pentad against {name32}: "
              f"{'equal at all ' + str(n) if diff is None else 'differ at position ' + str(diff)}",
              flush=True)
        del ref32
        if gpu:
            torch.cuda.empty_cache()
        if diff is not None:
            print(f"pentad: {ours}\nreference: {theirs}")
            sys.exit(f"the fp32 greedy ids differ at position {diff} of {n}")

    ref_name, reference = load_reference(a, hf, dtype)
    result["reference"] = ref_name
    pentad_run(a, ckpt, prompt, 8, a.precision, env)  # warm-ups (page cache, libraries)
    timed(a, reference, prompt, 8)
    runs = {k: [] for k in ("pentad", "pentad_s", "ref", "ref_s", "uncached", "same", "diff")}
    for r in range(a.repeats):
        speed, seconds, ours = pentad_run(a, ckpt, prompt, a.new_tokens, a.precision, env)
        runs["pentad"].append((speed, seconds))
        speed, seconds, ref = timed(a, reference, prompt, a.new_tokens)
        runs["ref"].append((speed, seconds))
        if a.short_tokens:
            runs["pentad_s"].append(pentad_run(a, ckpt, prompt, a.short_tokens, a.precision,
                                               env)[1])
            runs["ref_s"].append(timed(a, reference, prompt, a.short_tokens)[1])
        if a.no_cache_tokens:
            runs["uncached"].append(pentad_run(a, ckpt, prompt, a.no_cache_tokens, a.precision,
                                               env, "--no-cache")[0])
        runs["same"].append(sum(x == y for x, y in zip(ours, ref)))
        runs["diff"].append(first_difference(ours, ref))
        print(f"repeat {r + 1}: pentad {runs['pentad'][-1][0]:.1f}, reference "
              f"{runs['ref'][-1][0]:.1f} tokens/s end to end; greedy ids equal at "
              f"{runs['same'][-1]} of {a.new_tokens} positions (first difference: "
              f"{runs['diff'][-1]})", flush=True)

    print(f"\nGPT-2 {'124M' if not a.layers else f'{a.layers}x{a.width}'} shape, {a.device}"
          f"{' (' + result['gpu'] + ')' if gpu else ''}, {a.precision}, context {a.context}, "
          f"prompt {PROMPT_TOKENS}, {a.new_tokens} new tokens, {a.repeats} repeats; "
          f"reference: {ref_name}")
    end = {"pentad": [s for s, _ in runs["pentad"]], "ref": [s for s, _ in runs["ref"]]}
    result["pentad_tokens_per_s"] = summary("pentad end to end", end["pentad"])
    result["reference_tokens_per_s"] = summary("reference end to end", end["ref"])
    if a.short_tokens:
        n = a.new_tokens - a.short_tokens
        dec = {k: [n / max(t - s, 1e-9) for (_, t), s in zip(runs[k], runs[k + "_s"])]
               for k in ("pentad", "ref")}
        result["pentad_decode_tokens_per_s"] = summary(
            f"pentad decode ({a.new_tokens} - {a.short_tokens} tokens)", dec["pentad"])
        result["reference_decode_tokens_per_s"] = summary(
            f"reference decode ({a.new_tokens} - {a.short_tokens} tokens)", dec["ref"])
        paired = [x / y for x, y in zip(dec["pentad"], dec["ref"])]
        result["decode_ratio_per_repeat"] = paired
        result["decode_ratio"] = statistics.median(paired)
        print(f"decode, pentad / reference per repeat: {', '.join(f'{r:.2f}' for r in paired)} "
              f"(median {result['decode_ratio']:.2f}x)")
    paired = [x / y for x, y in zip(end["pentad"], end["ref"])]
    result["end_to_end_ratio"] = statistics.median(paired)
    print(f"end to end, pentad / reference per repeat: {', '.join(f'{r:.2f}' for r in paired)} "
          f"(median {result['end_to_end_ratio']:.2f}x)")
    if runs["uncached"]:
        result["pentad_no_cache_tokens_per_s"] = summary(
            f"pentad --no-cache ({a.no_cache_tokens} tokens)", runs["uncached"])
        print(f"cached / --no-cache: {result['pentad_tokens_per_s'] / result['pentad_no_cache_tokens_per_s']:.1f}x"
              " (medians, end to end)")
    result["greedy_equal_positions"] = runs["same"]
    result["greedy_first_difference"] = runs["diff"]
    print(f"greedy ids in {a.precision}: equal at {runs['same']} of {a.new_tokens} positions "
          f"(first differences {runs['diff']})")
    if a.json:
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
