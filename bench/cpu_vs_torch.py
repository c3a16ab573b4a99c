#!/usr/bin/env python3
"""pentad against PyTorch training the same GPT-2 model on the same CPU threads.

Alternates pentad and PyTorch runs (A B A B ...), takes each run's median step time
after warm-up, and reports tokens/s of each and their ratio, plus pentad's training
FLOP/s as a fraction of the machine's measured sgemm rate.

usage: bench/cpu_vs_torch.py [--config small|large|both] [--reps 3] [--threads 2]
Needs build/pentad and build/pentad_sgemm_bench (scripts/build.sh) and python3-torch.
"""
import argparse
import json
import math
import statistics
import subprocess
import time
from pathlib import Path

from blas_env import same_blas_kernels

same_blas_kernels()  # before torch loads OpenBLAS
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {
    "small": dict(n_layer=4, d_model=256, n_head=4, seq=256, vocab=8192, batch=8, steps=8),
    "large": dict(n_layer=12, d_model=768, n_head=12, seq=512, vocab=8192, batch=4, steps=5),
}
WARMUP = 2


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.down = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(c // self.h)
        a = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg["d_model"]
        self.wte = nn.Embedding(cfg["vocab"], c)
        self.wpe = nn.Embedding(cfg["seq"], c)
        self.blocks = nn.ModuleList(Block(c, cfg["n_head"]) for _ in range(cfg["n_layer"]))
        self.ln_f = nn.LayerNorm(c)
        self.register_buffer("mask", torch.ones(cfg["seq"], cfg["seq"], dtype=torch.bool).triu(1))

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.T
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def torch_run(cfg, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    times = []
    for _ in range(cfg["steps"]):
        idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]))
        tgt = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(idx, tgt).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return cfg["batch"] * cfg["seq"] / statistics.median(times[WARMUP:])


def pentad_run(cfg, threads, out):
    sets = {
        "model.family": "gpt2", "model.n_layer": cfg["n_layer"], "model.d_model": cfg["d_model"],
        "model.n_head": cfg["n_head"], "model.vocab_size": cfg["vocab"],
        "model.max_seq_len": cfg["seq"], "train.seq_len": cfg["seq"],
        "train.micro_batch": cfg["batch"], "train.grad_accum": 1, "train.steps": cfg["steps"],
        "train.eval_every": 0, "train.threads": threads, "data.source": "random",
        "train.out_dir": str(out),
    }
    cmd = [str(ROOT / "build/pentad"), "train", str(ROOT / "recipes/gpt-tiny.toml")]
    cmd += [f"{k}={v}" for k, v in sets.items()]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "tokens_per_second" in r][WARMUP:]
    return (statistics.median(r["tokens_per_second"] for r in rows),
            statistics.median(r["flops_per_second"] for r in rows))


def sgemm_rate(threads):
    out = subprocess.run([str(ROOT / "build/pentad_sgemm_bench"), "2048", str(threads)],
                         check=True, capture_output=True, text=True).stdout
    return float(out.split()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="both", choices=["small", "large", "both"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    names = ["small", "large"] if args.config == "both" else [args.config]
    gemm = sgemm_rate(args.threads)
    print(f"sgemm 2048^3, {args.threads} threads: {gemm / 1e9:.1f} GFLOP/s; torch {torch.__version__}")
    out = ROOT / "bench/out"
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        cfg = CONFIGS[name]
        p_tok, t_tok, p_flops = [], [], []
        for rep in range(args.reps):
            tok, flops = pentad_run(cfg, args.threads, out / f"{name}-{rep}")
            p_tok.append(tok)
            p_flops.append(flops)
            t_tok.append(torch_run(cfg, args.threads))
            print(f"  {name} rep {rep}: pentad {tok:.0f} tok/s, torch {t_tok[-1]:.0f} tok/s")
        p, t, f = statistics.median(p_tok), statistics.median(t_tok), statistics.median(p_flops)
        print(f"{name}: L={cfg['n_layer']} C={cfg['d_model']} T={cfg['seq']} V={cfg['vocab']} "
              f"B={cfg['batch']}: pentad {p:.0f} tok/s, PyTorch {t:.0f} tok/s, ratio {p / t:.2f}x; "
              f"pentad {f / 1e9:.1f} GFLOP/s = {f / gemm:.2f} of sgemm")


if __name__ == "__main__":
    main()
