"""torch.optim.AdamW's update rate on the CPU: the peer of pentad_adamw_bench (bench/adamw_rate.cpp).

    /usr/bin/python3 bench/torch_adamw.py [--elements 100000000] [--reps 20] [--threads 2]

Same tables as the pentad program, with random parameters and gradients:
  flat  one tensor of --elements F32 elements (weight decay on);
  gpt2  GPT-2 124M's 148 tensors (decay on matrices, none on norms and biases: two groups).
Same hyperparameters as pentad's default [optim] (lr 6e-4, betas (0.9, 0.95), eps 1e-8,
weight decay 0.1). For each implementation torch offers: the default (foreach=None: whatever
this version picks), foreach=True (one _foreach_ op per stage over all tensors),
foreach=False (a loop over tensors, one op per stage each) and fused=True (one kernel per
tensor, where this version has it on the CPU; reported as skipped when it raises).
Prints the median step time over --reps after 2 warm-ups; lines starting "RESULT" are for
bench/adamw_bench.sh.
"""

import argparse
import statistics
import time

from blas_env import same_blas_kernels

same_blas_kernels()  # before torch loads OpenBLAS
import torch

VARIANTS = {
    "default": {},
    "foreach": {"foreach": True},
    "forloop": {"foreach": False},
    "fused": {"fused": True},
}


def gpt2_124m_shapes():
    V, T, C, L = 50257, 1024, 768, 12
    shapes = [(V, C), (T, C)]
    for _ in range(L):
        shapes += [(C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,), (4 * C, C),
                   (4 * C,), (C, 4 * C), (C,)]
    return shapes + [(C,), (C,)]


def make_params(shapes, seed):
    gen = torch.Generator().manual_seed(seed)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.rand(shape, generator=gen) * 2 - 1)
        p.grad = torch.rand(shape, generator=gen) * 2 - 1
        params.append(p)
    return params


def time_variant(params, kwargs, reps):
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, **kwargs)
    for _ in range(2):
        opt.step()
    seconds = []
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.step()
        seconds.append(time.perf_counter() - t0)
    del opt  # frees the moments before the next variant allocates its own
    return statistics.median(seconds)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--elements", type=int, default=100_000_000)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layouts", default="flat,gpt2")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__} AdamW, {torch.get_num_threads()} threads, "
          f"median of {args.reps} after 2 warm-ups")
    for layout in args.layouts.split(","):
        # flat: 2-D, so that it decays like pentad's flat parameter
        shapes = [(1, args.elements)] if layout == "flat" else gpt2_124m_shapes()
        params = make_params(shapes, seed=1)
        n = sum(p.numel() for p in params)
        for name in args.variants.split(","):
            try:
                step_s = time_variant(params, VARIANTS[name], args.reps)
            except (RuntimeError, TypeError, ValueError) as e:
                print(f"{layout:5s} {name:8s} skipped: {str(e).splitlines()[0]}")
                continue
            rate = n / step_s
            print(f"{layout:5s} {name:8s} {n:11d} elements in {len(params):3d} tensors: "
                  f"step {1e3 * step_s:8.2f} ms, {rate / 1e9:6.3f} G params/s, "
                  f"{28 * rate / 1e9:6.2f} GB/s at pentad's 28 bytes per element")
            print(f"RESULT {layout} {name} params_per_second {rate:.6g}")
        del params


if __name__ == "__main__":
    main()
