"""PyTorch's fused attention (torch.nn.functional.scaled_dot_product_attention: causal,
bf16, grouped-query through enable_gqa) at the shapes and with the timing of
bench/gpu_kernels.cpp's attention rows (CUDA events, median of 20 runs after 3 warm-ups),
printed in the same format, so the three implementations line up in one table:
pentad's kernel, cuDNN's through pentad, and whatever backend PyTorch picks (flash or
cuDNN). Never run as a test; scripts/gpu_bench.sh runs it on the GPU machine.
    python3 bench/attention_torch.py [B] [T]
"""
import statistics
import sys

import torch
import torch.nn.functional as F


def median_ms(f):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        f()
    times = []
    for _ in range(20):
        start.record()
        f()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def report(name, ms, flops):
    print(f"{name:40} {ms:9.3f} ms  {flops / ms * 1e-9:8.1f} TFLOP/s", flush=True)


def main():
    if not torch.cuda.is_available():
        sys.exit("no CUDA device")
    B = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    T = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; B {B}, T {T}, bf16")
    for hq, hkv, d in [(12, 12, 64), (32, 8, 64), (16, 2, 128), (8, 8, 160), (4, 1, 256)]:
        # SDPA's layout is (b, h, t, d): transposed views of (b, t, h, d), as pentad's are.
        q = torch.randn(B, T, hq, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        k = torch.randn(B, T, hkv, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        v = torch.randn(B, T, hkv, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        for t in (q, k, v):
            t.requires_grad_(True)
        dout = torch.randn(B, hq, T, d, device="cuda", dtype=torch.bfloat16)
        fwd = 2.0 * B * hq * T * T * d
        shape = f" h{hq}:{hkv} d{d}"

        def forward():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hkv != hq)

        with torch.no_grad():
            report("attention_forward torch" + shape, median_ms(forward), fwd)
        out = forward()

        def backward():
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

        report("attention_backward torch" + shape, median_ms(backward), 2.5 * fwd)


if __name__ == "__main__":
    main()
