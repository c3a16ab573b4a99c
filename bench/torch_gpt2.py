#!/usr/bin/env python3
"""PyTorch's GPT-2 training throughput: the peer that pentad's GPU runs are measured against.

The model and the step are pentad's recipes/gpt2-124m.toml as bench/ runs it: GPT-2 small
(12 layers, width 768, 12 heads, sequence 1024, vocabulary 50257 padded to 50304 as llm.c
pads it), tied embeddings, micro-batch 4 with 8 accumulated micro-batches a step, AdamW
(betas 0.9/0.95, weight decay 0.1 on matrices and embeddings), global-norm clipping at 1.0,
random tokens. On CUDA it uses what makes PyTorch fast: bf16 autocast with fp32 master
weights, F.scaled_dot_product_attention (causal), fused AdamW and torch.compile.

Each step is timed with CUDA events around the whole step (micro-batches, clipping,
optimizer), as pentad and llm.c time theirs; the first --warmup steps (torch.compile,
cuBLAS heuristics, allocator growth) are left out and the median of the rest is reported.
FLOPs count as pentad's Model::flops_per_micro_batch counts them (src/model/model.cpp), so
the MFU figures are comparable:
    per token, forward = L * (2C^2 + 2C*C_kv + 2CF + C*T) + V*C    (C*T: causal attention)
    per step = 3 * 2 * tokens * that                                  (backward = 2x forward)
MFU = model FLOP/s over the device's dense bf16 peak (--peak-tflops, or from the device's
name: 989.4 TFLOP/s for an H100 SXM or H200, the datasheet figure). --measure-gemm also
times a large bf16 matrix product, the ceiling actually reachable on that device.

Prints progress to stderr and one JSON line to stdout. Runs on the CPU too (a smoke test:
tiny sizes, fp32; older PyTorch without compile or SDPA falls back, and the JSON says so).

usage:
  python3 bench/torch_gpt2.py                          # GPT-2 124M on the GPU, bf16, compiled
  python3 bench/torch_gpt2.py --no-compile --steps 20
  /usr/bin/python3 bench/torch_gpt2.py --device cpu --layers 2 --width 64 --heads 4 \\
      --seq 64 --vocab 512 --micro-batch 2 --grad-accum 2 --steps 4 --warmup 1
"""
import argparse
import inspect
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")

# Dense bf16 tensor-core peaks by datasheet, TFLOP/s (no sparsity), matched on the name
# torch reports: the first entry whose words all appear in it wins.
PEAKS = [
    (("H200", "NVL"), 835.0),
    (("H200",), 989.4),  # SXM ("NVIDIA H200")
    (("H100", "PCIe"), 756.0),
    (("H100", "NVL"), 835.0),
    (("H100",), 989.4),  # SXM ("NVIDIA H100 80GB HBM3")
    (("A100",), 312.0),
]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Block(nn.Module):
    def __init__(self, c, heads, use_sdpa):
        super().__init__()
        self.heads, self.use_sdpa = heads, use_sdpa
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.down = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def attention(self, x):
        b, t, c = x.shape
        # (b, t, 3c) -> three (b, heads, t, head_dim)
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if self.use_sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch before 2.0
            s = (q @ k.transpose(-1, -2)) / math.sqrt(c // self.heads)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            y = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.down(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, layers, width, heads, seq, vocab, use_sdpa):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)  # tied: also the output head
        self.wpe = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads, use_sdpa) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        # pentad's initialisation: std 0.02, residual projections 0.02 / sqrt(2L), zero biases
        for name, p in self.named_parameters():
            if p.dim() == 2:
                residual = name.endswith(("proj.weight", "down.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if residual else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe.weight[:t]
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def flops_per_step(a):
    """pentad's count (Model::flops_per_micro_batch) times the accumulated micro-batches."""
    c, f, t, v = a.width, 4 * a.width, a.seq, a.vocab
    c_kv = c  # GPT-2: as many kv heads as query heads
    per_layer = 2 * c * c + 2 * c * c_kv + 2 * c * f + c * t
    per_token = a.layers * per_layer + v * c
    return 3.0 * 2.0 * (a.micro_batch * t) * per_token * a.grad_accum


def peak_tflops(device_name, override):
    if override:
        return override
    for words, peak in PEAKS:
        if all(w in device_name for w in words):
            return peak
    return None


def make_optimizer(model, lr, device):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = dict(lr=lr, betas=(0.9, 0.95), eps=1e-8)
    fused = device.type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
    if fused:
        kwargs["fused"] = True
    return torch.optim.AdamW(groups, **kwargs), fused


def measure_gemm(device, dtype):
    """Median TFLOP/s of an n^3 matrix product on random data (CUDA events on the GPU)."""
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = []
    for i in range(13):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            a @ b
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            a @ b
            seconds = time.perf_counter() - t0
        if i >= 3:
            times.append(seconds)
    return {"n": n, "dtype": str(dtype).replace("torch.", ""),
            "tflops": 2.0 * n ** 3 / statistics.median(times) / 1e12}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default=None,
                    help="bf16 autocast (default on CUDA) or fp32 without TF32 (default on CPU)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50304, help="50257 padded to 50304, as llm.c")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--grad-accum", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30, help="timed steps after the warm-up")
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    ap.add_argument("--peak-tflops", type=float, default=0.0,
                    help="dense bf16 peak for MFU (default: from the device name)")
    ap.add_argument("--measure-gemm", action="store_true",
                    help="also time an 8192^3 bf16 matrix product (the reachable ceiling)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    device = torch.device(a.device)
    precision = a.precision or ("bf16" if device.type == "cuda" else "fp32")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    if device.type == "cuda":
        # fp32 means fp32 here, as in pentad's fp32 path; bf16 GEMMs are unaffected.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = f"CPU ({torch.get_num_threads()} threads)"

    model = GPT2(a.layers, a.width, a.heads, a.seq, a.vocab, HAVE_SDPA).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    optimizer, fused = make_optimizer(model, a.lr, device)
    compiled = False
    if not a.no_compile:
        if hasattr(torch, "compile"):
            model = torch.compile(model)
            compiled = True
        else:
            log("torch.compile is not in this PyTorch; running eager")

    # A pool of random micro-batches (inputs, targets) made up front: no step waits for data.
    pool = []
    for _ in range(min(16, a.grad_accum * 2)):
        tokens = torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), device=device)
        pool.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                              enabled=precision == "bf16")

    def step(i):
        optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=device)
        for m in range(a.grad_accum):
            inputs, targets = pool[(i * a.grad_accum + m) % len(pool)]
            with autocast:
                loss = model(inputs, targets)
            (loss / a.grad_accum).backward()
            loss_sum += loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss_sum / a.grad_accum, grad_norm

    total = a.warmup + a.steps
    seconds, losses = [], []
    log(f"torch {torch.__version__} on {device_name}: GPT-2 {a.layers}L {a.width}C {a.heads}H, "
        f"T {a.seq}, V {a.vocab} ({n_params / 1e6:.1f}M parameters), {precision}, "
        f"micro-batch {a.micro_batch} x {a.grad_accum}, compile {compiled}, sdpa {HAVE_SDPA}, "
        f"fused AdamW {fused}")
    for i in range(total):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss, norm = step(i)
            end.record()
            end.synchronize()
            s = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            loss, norm = step(i)
            s = time.perf_counter() - t0
        seconds.append(s)
        losses.append(float(loss))
        log(f"step {i + 1:3d}/{total} | loss {losses[-1]:.4f} | norm {float(norm):.3f} | "
            f"{s * 1e3:.1f} ms{' (warm-up)' if i < a.warmup else ''}")

    timed = seconds[a.warmup:] or seconds
    median_s = statistics.median(timed)
    tokens = a.micro_batch * a.seq * a.grad_accum
    flops = flops_per_step(a)
    peak = peak_tflops(device_name, a.peak_tflops) if device.type == "cuda" else a.peak_tflops
    peak = peak or None
    result = {
        "bench": "torch_gpt2",
        "device": device_name,
        "torch": torch.__version__,
        "precision": precision,
        "compile": compiled,
        "sdpa": HAVE_SDPA,
        "fused_adamw": fused,
        "model": {"layers": a.layers, "width": a.width, "heads": a.heads, "seq": a.seq,
                  "vocab": a.vocab, "parameters": n_params},
        "micro_batch": a.micro_batch,
        "grad_accum": a.grad_accum,
        "tokens_per_step": tokens,
        "warmup_steps": a.warmup,
        "timed_steps": len(timed),
        "first_step_s": seconds[0],
        "ms_per_step": median_s * 1e3,
        "ms_per_step_min": min(timed) * 1e3,
        "ms_per_step_max": max(timed) * 1e3,
        "tokens_per_second": tokens / median_s,
        "flops_per_step": flops,
        "tflops": flops / median_s / 1e12,
        "peak_tflops": peak,
        "mfu": flops / median_s / 1e12 / peak if peak else None,
        "loss_first": losses[0],
        "loss_last": losses[-1],
    }
    if device.type == "cuda":
        result["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    if a.measure_gemm:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        result["gemm"] = measure_gemm(device, dtype)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
