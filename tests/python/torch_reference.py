#!/usr/bin/env python3
"""pentad against PyTorch on the same weights and batches.

Runs `pentad reference`, which dumps its initial weights, batches, first logits, first
gradients and the losses of N AdamW steps; rebuilds the same model in PyTorch from those
weights (fp32) and checks: logits, loss and every parameter gradient within 1e-5 relative
(norm-wise per tensor), and every step's loss within 1e-5 relative.

Mixture-of-Experts layers (torch_moe.py, from src/model/moe.h) add their losses to each
micro-batch's objective, and each layer's expert bias moves by the sign rule after every
step (it takes no gradient and no AdamW update). Optional outputs of `pentad reference`
that are checked when present: manifest "first_moe_losses" {aux, seq_aux, z} (the first
micro-batch's, summed over layers), moe_losses.npy (steps, 3) (the same per step, the mean
over micro-batches), final.NAME.npy (weights after the last step; the expert biases are
compared). manifest "losses" = "objective" says losses.npy and first_loss hold the
objective (cross-entropy + MoE losses); by default they hold the mean cross-entropy.

usage: torch_reference.py PENTAD RECIPE WORKDIR [section.key=value ...]
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from torch_moe import MoeStats, moe_block, moe_layer_indices, update_bias

TOL = 1e-5
MOE_LOSSES = ("aux", "seq_aux", "z")


def load_recipe_values(text):
    import tomllib
    return tomllib.loads(text)


def rel_err(a, b):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def rope(x, theta):
    # x: (b, t, h, d); "rotate half" pairing (i, i + d/2); angles in double like pentad.
    b, t, h, d = x.shape
    inv = theta ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2.0 / d)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    cos = torch.cos(ang).to(x.dtype)[None, :, None, :]
    sin = torch.sin(ang).to(x.dtype)[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def forward(p, tokens, targets, cfg, stats=None):
    """Logits, mean cross-entropy, the MoE losses summed over layers ({aux, seq_aux, z}) and
    each MoE layer's picks per expert ({bias name: (E,)})."""
    m = cfg["model"]
    moe_layers = set(moe_layer_indices(m))
    stats = stats or MoeStats()
    moe_losses = {name: torch.zeros(()) for name in MOE_LOSSES}
    counts = {}
    gpt2 = m["family"] == "gpt2"
    L, C, H = m["n_layer"], m["d_model"], m["n_head"]
    Hkv = m["n_kv_head"] or H
    d = C // H
    eps = m["norm_eps"]
    b, t = tokens.shape

    def norm(x, prefix):
        if gpt2:
            return F.layer_norm(x, (C,), p[prefix + ".weight"], p[prefix + ".bias"], eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * p[prefix + ".weight"]

    def linear(x, prefix):
        return F.linear(x, p[prefix + ".weight"], p.get(prefix + ".bias"))

    x = p["wte.weight"][tokens]
    if gpt2:
        x = x + p["wpe.weight"][:t][None]
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    for l in range(L):
        pre = f"layers.{l}."
        h = norm(x, pre + "norm1")
        q = linear(h, pre + "attn.q").view(b, t, H, d)
        k = linear(h, pre + "attn.k").view(b, t, Hkv, d)
        v = linear(h, pre + "attn.v").view(b, t, Hkv, d)
        if not gpt2:
            q, k = rope(q, m["rope_theta"]), rope(k, m["rope_theta"])
        k = k.repeat_interleave(H // Hkv, dim=2)
        v = v.repeat_interleave(H // Hkv, dim=2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # (b, h, t, d)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        s = s.masked_fill(mask, float("-inf"))
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, C)
        x = x + linear(a, pre + "attn.o")
        h = norm(x, pre + "norm2")
        if (pre + "moe.router.weight" in p) != (l in moe_layers):
            raise SystemExit(f"layer {l}: the weights and model.moe_layers disagree")
        if l in moe_layers:
            out, losses, counts[pre + "moe.expert_bias"] = moe_block(p, pre, h, cfg, stats)
            x = x + out
            for name in MOE_LOSSES:
                moe_losses[name] = moe_losses[name] + losses[name]
            continue
        if gpt2:
            h = F.gelu(linear(h, pre + "mlp.up"), approximate="tanh")
        else:
            h = F.silu(linear(h, pre + "mlp.gate")) * linear(h, pre + "mlp.up")
        x = x + linear(h, pre + "mlp.down")
    x = norm(x, "norm_f")
    head = p["wte.weight"] if m["tie_embeddings"] else p["lm_head.weight"]
    logits = x @ head.T
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return logits, loss, moe_losses, counts


def learning_rate(o, step, total):
    if step < o["warmup_steps"]:
        return o["lr"] * (step + 1) / o["warmup_steps"]
    if o["decay"] == "constant":
        return o["lr"]
    min_lr = o["lr"] * o["min_lr_ratio"]
    decay_steps = total - o["warmup_steps"]
    if decay_steps <= 0:
        return o["lr"]
    ratio = min(1.0, (step - o["warmup_steps"]) / decay_steps)
    factor = 1.0 - ratio if o["decay"] == "linear" else 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + factor * (o["lr"] - min_lr)


def moe_report(cfg, params, stats, work, check, failures):
    """The expert biases after the last step, and what the run exercised."""
    lines = []
    for name in [n for n in params if n.endswith(".moe.expert_bias")]:
        path = work / f"final.{name}.npy"
        if path.exists():
            lines.append(check(f"final {name}", rel_err(np.load(path), params[name].detach())
                               if params[name].norm() > 0 else
                               float(np.abs(np.load(path)).max())))
    if cfg["moe"]["bias_update_rate"] > 0:
        moved = sum(int((params[n] != 0).sum()) for n in params if n.endswith(".moe.expert_bias"))
        lines.append(f"expert biases moved by the sign rule: {moved} nonzero")
    lines.append(f"routing: {stats.picks} picks, smallest gap at a top-k boundary "
                 f"{stats.select_margin:.2e}")
    if cfg["moe"]["capacity_factor"] > 0:
        lines.append(f"capacity dropped {stats.dropped} of {stats.picks} picks, smallest gap at "
                     f"a capacity boundary {stats.capacity_margin:.2e}")
        if stats.dropped == 0:  # the drop policy would go untested
            failures.append("capacity dropped no pick: lower moe.capacity_factor")
    return lines


def main():
    pentad, recipe, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    overrides = sys.argv[4:]
    steps = 10
    cmd = [pentad, "reference", recipe, "--out", str(work), "--steps", str(steps)]
    for o in overrides:
        cmd += ["--set", o]
    subprocess.run(cmd, check=True)
    torch.set_num_threads(2)
    manifest = json.loads((work / "manifest.json").read_text())
    cfg = load_recipe_values(manifest["recipe"])
    accum = cfg["train"]["grad_accum"]

    # The expert biases steer selection only: no gradient, no AdamW, the sign rule instead.
    params, trained = {}, []
    for entry in manifest["params"]:
        arr = np.load(work / f"init.{entry['name']}.npy")
        is_bias = entry["name"].endswith(".moe.expert_bias")
        params[entry["name"]] = torch.tensor(arr, requires_grad=not is_bias)
        if not is_bias:
            trained.append(entry)
    objective_losses = manifest.get("losses", "cross_entropy") == "objective"
    stats = MoeStats()

    def batch(step, micro):
        tag = f"{step}.{micro}"
        return (torch.tensor(np.load(work / f"inputs.{tag}.npy")).long(),
                torch.tensor(np.load(work / f"targets.{tag}.npy")).long())

    failures = []

    def check(what, err):
        status = "ok" if err <= TOL else "FAIL"
        if err > TOL:
            failures.append(what)
        return f"{what}: {err:.2e} {status}"

    # 1. logits and loss of the first micro-batch.
    with torch.no_grad():
        logits, loss, moe_losses, _ = forward(params, *batch(0, 0), cfg, stats)
    if objective_losses:
        loss = loss + sum(moe_losses.values())
    lines = [check("logits", rel_err(np.load(work / "logits.npy"), logits)),
             check("loss", abs(manifest["first_loss"] - loss.item()) / abs(loss.item()))]
    if "first_moe_losses" in manifest:
        for name in MOE_LOSSES:
            ours, theirs = manifest["first_moe_losses"][name], moe_losses[name].item()
            lines.append(check(f"first {name} loss ({ours:.7g} vs {theirs:.7g})",
                               abs(ours - theirs) / max(abs(theirs), 1e-12)))

    # 2. gradients of step 0 (accumulated over micro-batches) and 3. AdamW steps.
    o = cfg["optim"]
    decay = [params[e["name"]] for e in trained if e["weight_decay"]]
    no_decay = [params[e["name"]] for e in trained if not e["weight_decay"]]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    ref_losses = np.load(work / "losses.npy")
    moe_path = work / "moe_losses.npy"
    ref_moe = np.load(moe_path) if moe_path.exists() else None
    rate = cfg.get("moe", {}).get("bias_update_rate", 0.0)
    worst_grad, worst_name, worst_loss = 0.0, "", 0.0
    for step in range(steps):
        opt.zero_grad()
        total, step_moe, step_counts = 0.0, np.zeros(len(MOE_LOSSES)), {}
        for micro in range(accum):
            _, loss, moe_losses, counts = forward(params, *batch(step, micro), cfg, stats)
            objective = loss + sum(moe_losses.values())
            (objective / accum).backward()
            total += (objective if objective_losses else loss).item() / accum
            step_moe += np.array([moe_losses[n].item() for n in MOE_LOSSES]) / accum
            for name, c in counts.items():
                step_counts[name] = step_counts.get(name, 0) + c
        if step == 0:
            total_norm = math.sqrt(sum(p.grad.double().pow(2).sum().item()
                                       for p in params.values() if p.grad is not None))
            for e in manifest["params"]:
                ours = torch.tensor(np.load(work / f"grad.{e['name']}.npy"), dtype=torch.float64)
                grad = params[e["name"]].grad
                theirs = torch.zeros_like(ours) if grad is None else grad.double()
                if theirs.norm() < 1e-6 * total_norm:
                    # Zero in exact arithmetic (e.g. the key bias: softmax ignores a constant
                    # added to every score of a row); both sides hold rounding noise only.
                    err = (ours - theirs).norm().item() / total_norm
                    lines.append(f"grad {e['name']} is zero up to rounding: "
                                 f"|diff| / |all grads| = {err:.2e}")
                else:
                    err = rel_err(ours, theirs)
                if err > worst_grad:
                    worst_grad, worst_name = err, e["name"]
                if err > TOL:
                    failures.append("grad " + e["name"])
        if o["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_([params[e["name"]] for e in trained], o["grad_clip"])
        for g in opt.param_groups:
            g["lr"] = learning_rate(o, step, cfg["train"]["steps"])
        opt.step()
        if rate > 0:
            update_bias(params, step_counts, rate)
        err = abs(ref_losses[step] - total) / abs(total)
        worst_loss = max(worst_loss, err)
        if err > TOL:
            failures.append(f"loss of step {step + 1}")
        moe_text = ""
        if step_counts:
            moe_text = " | moe " + " ".join(f"{n} {v:.3e}" for n, v in zip(MOE_LOSSES, step_moe))
        if ref_moe is not None:
            moe_err = (np.abs(ref_moe[step] - step_moe) / np.maximum(np.abs(step_moe), 1e-12)).max()
            worst_loss = max(worst_loss, moe_err)
            if moe_err > TOL:
                failures.append(f"MoE losses of step {step + 1}")
            moe_text += f" (pentad rel {moe_err:.2e})"
        print(f"step {step + 1}: pentad {ref_losses[step]:.7f} torch {total:.7f} rel {err:.2e}"
              f"{moe_text}")
    lines.append(f"worst gradient: {worst_name} {worst_grad:.2e}")
    lines.append(f"worst step loss: {worst_loss:.2e}")
    if moe_layer_indices(cfg["model"]):
        lines += moe_report(cfg, params, stats, work, check, failures)
    print("\n".join(lines))
    if failures:
        print("FAILED:", ", ".join(failures))
        sys.exit(1)
    print("pentad matches PyTorch")


if __name__ == "__main__":
    main()
