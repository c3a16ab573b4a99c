#!/usr/bin/env python3
"""PyTorch's side of bench/moe_bench.sh: the same MoE block as pentad's MoeBlock (LLaMA
family: softmax router, top-k renormalised, SwiGLU experts, no balancing losses), written
the usual way (as Hugging Face's Mixtral block): a loop over the experts that gathers each
expert's tokens with index_select and adds the weighted outputs back with index_add_.

Forward + backward (parameter gradients and the input's) on random rows, median over
--iters after 2 warm-ups. Prints "tokens_per_second <v>" like pentad_moe_block_bench.

usage: /usr/bin/python3 bench/torch_moe_block.py C E K F TOKENS [--threads 2] [--iters 10]
                                                 [--skew]
"""
import argparse
import math
import statistics
import time

from blas_env import same_blas_kernels

same_blas_kernels()  # before torch loads OpenBLAS
import torch
import torch.nn.functional as Fn


class SwiGLU(torch.nn.Module):
    def __init__(self, c, f, std, down_std):
        super().__init__()
        self.gate = torch.nn.Parameter(torch.randn(f, c) * std)
        self.up = torch.nn.Parameter(torch.randn(f, c) * std)
        self.down = torch.nn.Parameter(torch.randn(c, f) * down_std)

    def forward(self, x):
        return Fn.linear(Fn.silu(Fn.linear(x, self.gate)) * Fn.linear(x, self.up), self.down)


class MoeBlock(torch.nn.Module):
    def __init__(self, c, e, k, f, std=0.02, n_layer=1):
        super().__init__()
        self.k = k
        self.router = torch.nn.Parameter(torch.randn(e, c) * std)
        self.bias = torch.zeros(e)  # selection only, as pentad's expert_bias
        down_std = std / math.sqrt(2 * n_layer)
        self.experts = torch.nn.ModuleList(SwiGLU(c, f, std, down_std) for _ in range(e))

    def forward(self, x):  # x (N, C)
        probs = torch.softmax(Fn.linear(x, self.router), dim=-1)
        _, picked = torch.topk(probs + self.bias, self.k, dim=-1)  # (N, k)
        w = probs.gather(1, picked)
        w = w / w.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(picked == e)
            if rows.numel() == 0:
                continue
            y = expert(x.index_select(0, rows)) * w[rows, slot].unsqueeze(1)
            out.index_add_(0, rows, y)
        return out


def main():
    ap = argparse.ArgumentParser()
    for name in ("C", "E", "K", "F", "TOKENS"):
        ap.add_argument(name, type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--skew", action="store_true", help="every token picks expert 0")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    block = MoeBlock(a.C, a.E, a.K, a.F)
    if a.skew:
        block.bias[0] = 1.0
    x = torch.randn(a.TOKENS, a.C, requires_grad=True)
    dout = torch.randn(a.TOKENS, a.C)

    def forward():  # a training forward: autograd records the graph, as pentad saves its acts
        block(x)

    def step():
        for p in block.parameters():
            p.grad = None
        x.grad = None
        block(x).backward(dout)

    def median_seconds(f):
        for _ in range(2):
            f()
        times = []
        for _ in range(a.iters):
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    fwd = median_seconds(forward)
    both = median_seconds(step)
    print(f"torch {torch.__version__} moe block C={a.C} E={a.E} K={a.K} F={a.F} "
          f"tokens={a.TOKENS} threads={torch.get_num_threads()} skew={int(a.skew)}")
    print(f"forward {fwd * 1e3:.3f} ms, forward+backward {both * 1e3:.3f} ms")
    print(f"tokens_per_second {a.TOKENS / both:.1f}")


if __name__ == "__main__":
    main()
