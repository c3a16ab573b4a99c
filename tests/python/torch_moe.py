"""The Mixture-of-Experts block of src/model/moe.h in PyTorch, written from that header's
formulas alone, for torch_reference.py.

Per MoE layer L, on the rows x (T, C) of the normalised input of one micro-batch (b
sequences of t tokens, T = b t):
  logits = x Wr^T (fp32); s = softmax or sigmoid (moe.score)
  picks  = top_k of s + bias, ties to the lower index; bias steers selection only
  w      = s at the picks (/ their sum with moe.renormalize)
  out    = sum over kept picks of w * expert(x), plus the shared experts on every row
  losses = aux + seq_aux + z (moe.h has them), each a micro-batch's own
Capacity (moe.capacity_factor f > 0): expert e keeps ceil(f T k / E) of its picks, those of
highest s, ties to the earlier token then the earlier pick; a dropped pick adds nothing.
"""
import math

import numpy as np
import torch
import torch.nn.functional as F


def moe_layer_indices(m):
    """model.moe_layers as a sorted list of layer indices (the grammar of config.h)."""
    pattern, n = m["moe_layers"].strip(), m["n_layer"]
    if m["n_experts"] == 0 or not pattern:
        return []
    if pattern == "all":
        return list(range(n))
    if pattern.startswith("every:"):
        every = int(pattern[6:])
        return list(range(every - 1, n, every))
    if pattern.startswith("from:"):
        return list(range(int(pattern[5:]), n))
    return sorted({int(tok) for tok in pattern.split(",")})


class MoeStats:
    """What the run exercised, so a test that could not fail says so: the smallest gap at a
    selection or capacity boundary (a gap near float rounding could flip a pick between
    pentad and torch), and how many picks capacity dropped."""

    def __init__(self):
        self.select_margin = math.inf
        self.capacity_margin = math.inf
        self.picks = 0
        self.dropped = 0


def mlp(p, prefix, x, gpt2):
    """An expert (or the shared experts as one MLP) of the family's kind."""
    def linear(z, name):
        return F.linear(z, p[f"{prefix}.{name}.weight"], p.get(f"{prefix}.{name}.bias"))
    if gpt2:
        return linear(F.gelu(linear(x, "up"), approximate="tanh"), "down")
    return linear(F.silu(linear(x, "gate")) * linear(x, "up"), "down")


def top_k_picks(key, k):
    """Indices (T, k) of the k largest values per row of key, ties to the lower index: a
    stable ascending sort of -key keeps equal values in index order."""
    order = torch.sort(-key, dim=-1, stable=True).indices
    return order[:, :k]


def capacity_keep(picks, s_picked, capacity, stats):
    """(T, k) bool: the picks each expert keeps, at most `capacity` of its picks, those of
    highest s; ties to the earlier token, then the earlier pick (row-major order)."""
    keep = torch.zeros_like(picks, dtype=torch.bool)
    flat_picks, flat_s, flat_keep = picks.reshape(-1), s_picked.reshape(-1), keep.view(-1)
    for e in torch.unique(flat_picks).tolist():
        where = (flat_picks == e).nonzero().squeeze(1)  # row-major: token, then pick
        order = torch.sort(-flat_s[where], stable=True).indices
        flat_keep[where[order[:capacity]]] = True
        if len(where) > capacity:
            ranked = flat_s[where[order]]
            stats.capacity_margin = min(stats.capacity_margin,
                                        (ranked[capacity - 1] - ranked[capacity]).item())
    stats.dropped += int((~keep).sum())
    return keep


def moe_block(p, pre, h, cfg, stats):
    """One MoE layer on h (b, t, C). Returns its output (b, t, C), its losses {aux, seq_aux,
    z} (coefficients applied) and the picks per expert (E,) before drops, for the bias rule."""
    m, o = cfg["model"], cfg["moe"]
    gpt2 = m["family"] == "gpt2"
    E, k = m["n_experts"], m["top_k"]
    b, t, C = h.shape
    T = b * t
    x = h.reshape(T, C)

    logits = x @ p[pre + "moe.router.weight"].T  # (T, E), fp32
    s = logits.softmax(-1) if o["score"] == "softmax" else torch.sigmoid(logits)
    key = s.detach() + p[pre + "moe.expert_bias"]
    picks = top_k_picks(key, k)  # (T, k)
    if k < E:
        ranked = key.sort(dim=-1, descending=True).values
        stats.select_margin = min(stats.select_margin, (ranked[:, k - 1] - ranked[:, k]).min().item())
    w = s.gather(1, picks)
    if o["renormalize"]:
        w = w / w.sum(-1, keepdim=True)
    stats.picks += T * k
    if o["capacity_factor"] > 0:
        f = float(np.float32(o["capacity_factor"]))
        keep = capacity_keep(picks, s.detach().gather(1, picks), math.ceil(f * T * k / E), stats)
    else:
        keep = torch.ones_like(picks, dtype=torch.bool)

    out = torch.zeros_like(x)
    for e in range(E):
        rows, slot = ((picks == e) & keep).nonzero(as_tuple=True)
        if len(rows) == 0:
            continue
        y = mlp(p, f"{pre}moe.experts.{e}", x[rows], gpt2)
        out = out.index_add(0, rows, y * w[rows, slot].unsqueeze(1))
    if m["n_shared_experts"] > 0:
        out = out + mlp(p, pre + "moe.shared", x, gpt2)

    counts = torch.bincount(picks.reshape(-1), minlength=E).to(x.dtype)  # constants
    prob = s if o["score"] == "softmax" else s / s.sum(-1, keepdim=True)
    losses = {}
    losses["aux"] = o["aux_loss_coef"] * E / (k * T * T) * (counts * prob.sum(0)).sum()
    seq_counts = torch.stack([torch.bincount(picks[i * t:(i + 1) * t].reshape(-1), minlength=E)
                              for i in range(b)]).to(x.dtype)  # (b, E)
    seq_prob = prob.reshape(b, t, E).sum(1)  # (b, E)
    losses["seq_aux"] = (o["seq_aux_loss_coef"] / b * E / (k * t * t) *
                         (seq_counts * seq_prob).sum())
    losses["z"] = o["z_loss_coef"] / T * torch.logsumexp(logits, -1).pow(2).sum()
    return out.reshape(b, t, C), losses, counts


def update_bias(params, step_counts, rate):
    """Aux-loss-free balancing after a step: bias_e += rate * sign(mean - count_e), counts of
    picks (before drops) over all the step's micro-batches."""
    rate = torch.tensor(rate, dtype=torch.float32)
    with torch.no_grad():
        for name, counts in step_counts.items():
            mean = counts.double().sum() / counts.numel()
            params[name] += rate * torch.sign(mean - counts.double()).float()
