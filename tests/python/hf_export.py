#!/usr/bin/env python3
"""pentad's Hugging Face export against a transformers-convention model in PyTorch.

1. `pentad reference` dumps pentad's initial weights (init.<name>.npy), a batch
   (inputs.0.0.npy) and pentad's logits on it (logits.npy).
2. `pentad train` with the same recipe and seed runs one step at a learning rate of 1e-30
   (weights move by ~1e-30: exact for every nonzero weight) and saves a checkpoint.
3. `pentad ckpt convert --to hf CHECKPOINT_DIR OUT_DIR` exports it; model.safetensors is
   loaded with safetensors.torch.load_file and
   (a) every tensor is checked against init.<name>.npy through the name map written out
       here independently of pentad's (GPT-2 Conv1D weights are [in, out]: transposed;
       c_attn = [Wq^T Wk^T Wv^T]),
   (b) a model written the way transformers computes (GPT2: x @ W + b with gelu_new;
       LLaMA: x @ W^T, rotate_half RoPE, repeat_kv) runs the batch; its logits must match
       logits.npy within 1e-4 relative.
4. `pentad ckpt convert --from hf OUT_DIR ROOT` imports the export again and a second
   export must give the same bytes for every tensor (and the same config.json).
5. GPT-2 only: `pentad ckpt convert --to llmc CHECKPOINT_DIR FILE` writes llm.c's model
   file; its header and parameter order are checked against the same tensors.

usage: hf_export.py PENTAD RECIPE WORKDIR [section.key=value ...]
Prints "hf export matches" on success.
"""
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

TOL = 1e-4          # logits, relative (norm-wise)
WEIGHT_ATOL = 1e-25  # what one step at lr 1e-30 can move a weight


def rel_err(a, b):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run(cmd):
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True)


def newest_checkpoint(root):
    dirs = sorted(d for d in Path(root).glob("step-*") if (d / "manifest.json").exists()
                  and not d.name.endswith(".partial"))
    if not dirs:
        sys.exit(f"no committed checkpoint under {root}")
    return dirs[-1]


def expected_hf(init, cfg):
    """pentad's tensors under transformers' names and layouts."""
    m = cfg["model"]
    L = m["n_layer"]
    out = {}
    if m["family"] == "gpt2":
        out["wte.weight"] = init["wte.weight"]
        out["wpe.weight"] = init["wpe.weight"]
        for l in range(L):
            p, h = f"layers.{l}.", f"h.{l}."
            out[h + "ln_1.weight"] = init[p + "norm1.weight"]
            out[h + "ln_1.bias"] = init[p + "norm1.bias"]
            out[h + "attn.c_attn.weight"] = np.concatenate(
                [init[p + f"attn.{x}.weight"].T for x in "qkv"], axis=1)
            out[h + "attn.c_attn.bias"] = np.concatenate([init[p + f"attn.{x}.bias"] for x in "qkv"])
            out[h + "attn.c_proj.weight"] = init[p + "attn.o.weight"].T
            out[h + "attn.c_proj.bias"] = init[p + "attn.o.bias"]
            out[h + "ln_2.weight"] = init[p + "norm2.weight"]
            out[h + "ln_2.bias"] = init[p + "norm2.bias"]
            out[h + "mlp.c_fc.weight"] = init[p + "mlp.up.weight"].T
            out[h + "mlp.c_fc.bias"] = init[p + "mlp.up.bias"]
            out[h + "mlp.c_proj.weight"] = init[p + "mlp.down.weight"].T
            out[h + "mlp.c_proj.bias"] = init[p + "mlp.down.bias"]
        out["ln_f.weight"] = init["norm_f.weight"]
        out["ln_f.bias"] = init["norm_f.bias"]
    else:
        out["model.embed_tokens.weight"] = init["wte.weight"]
        for l in range(L):
            p, h = f"layers.{l}.", f"model.layers.{l}."
            out[h + "input_layernorm.weight"] = init[p + "norm1.weight"]
            for x in "qkvo":
                out[h + f"self_attn.{x}_proj.weight"] = init[p + f"attn.{x}.weight"]
            out[h + "post_attention_layernorm.weight"] = init[p + "norm2.weight"]
            for x in ("gate", "up", "down"):
                out[h + f"mlp.{x}_proj.weight"] = init[p + f"mlp.{x}.weight"]
        out["model.norm.weight"] = init["norm_f.weight"]
    if not m["tie_embeddings"]:
        out["lm_head.weight"] = init["lm_head.weight"]
    return out


def causal_attention(q, k, v):
    # q: (b, h, t, d); k, v: (b, h, t, d)
    t, d = q.shape[2], q.shape[3]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def gpt2_logits(w, c, tokens):
    """transformers' GPT2LMHeadModel forward (eval), Conv1D: x @ W + b."""
    C, H, L = c["n_embd"], c["n_head"], c["n_layer"]
    d, eps = C // H, c["layer_norm_epsilon"]
    b, t = tokens.shape

    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))

    def heads(x):
        return x.view(b, t, H, d).transpose(1, 2)

    x = w["wte.weight"][tokens] + w["wpe.weight"][:t][None]
    for l in range(L):
        h = f"h.{l}."
        y = F.layer_norm(x, (C,), w[h + "ln_1.weight"], w[h + "ln_1.bias"], eps)
        q, k, v = (y @ w[h + "attn.c_attn.weight"] + w[h + "attn.c_attn.bias"]).split(C, dim=-1)
        a = causal_attention(heads(q), heads(k), heads(v)).transpose(1, 2).reshape(b, t, C)
        x = x + a @ w[h + "attn.c_proj.weight"] + w[h + "attn.c_proj.bias"]
        y = F.layer_norm(x, (C,), w[h + "ln_2.weight"], w[h + "ln_2.bias"], eps)
        y = gelu_new(y @ w[h + "mlp.c_fc.weight"] + w[h + "mlp.c_fc.bias"])
        x = x + y @ w[h + "mlp.c_proj.weight"] + w[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), w["ln_f.weight"], w["ln_f.bias"], eps)
    head = w["wte.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def llama_logits(w, c, tokens):
    """transformers' LlamaForCausalLM forward: rotate_half RoPE, repeat_kv for GQA."""
    C, H, L = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    Hkv, eps, theta = c["num_key_value_heads"], c["rms_norm_eps"], c["rope_theta"]
    d = C // H
    b, t = tokens.shape

    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rotate_half(x):
        return torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)

    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos().float()[None, None], emb.sin().float()[None, None]  # (1, 1, t, d)

    x = w["model.embed_tokens.weight"][tokens]
    for l in range(L):
        h = f"model.layers.{l}."
        y = rms(x, w[h + "input_layernorm.weight"])
        q = (y @ w[h + "self_attn.q_proj.weight"].T).view(b, t, H, d).transpose(1, 2)
        k = (y @ w[h + "self_attn.k_proj.weight"].T).view(b, t, Hkv, d).transpose(1, 2)
        v = (y @ w[h + "self_attn.v_proj.weight"].T).view(b, t, Hkv, d).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
        a = causal_attention(q, k, v).transpose(1, 2).reshape(b, t, C)
        x = x + a @ w[h + "self_attn.o_proj.weight"].T
        y = rms(x, w[h + "post_attention_layernorm.weight"])
        y = F.silu(y @ w[h + "mlp.gate_proj.weight"].T) * (y @ w[h + "mlp.up_proj.weight"].T)
        x = x + y @ w[h + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def check_llmc(path, hf, c):
    """llm.c's GPT-2 file (train_gpt2.c): 256 int32 header, then fp32 tensors in its order."""
    raw = Path(path).read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    C, L, V, T = c["n_embd"], c["n_layer"], c["vocab_size"], c["n_positions"]
    Vp = (V + 127) // 128 * 128
    want = [20240326, 3, T, V, L, c["n_head"], C, Vp]
    if list(header[:8]) != want or header[8:].any():
        return [f"llm.c header {list(header[:8])} != {want}"]
    params = np.frombuffer(raw[1024:], dtype="<f4")
    wte = np.zeros((Vp, C), dtype=np.float32)
    wte[:V] = hf["wte.weight"]
    # llm.c's weights are (out, in): the transpose of HF's Conv1D [in, out].
    per_layer = [("ln_1.weight", False), ("ln_1.bias", False), ("attn.c_attn.weight", True),
                 ("attn.c_attn.bias", False), ("attn.c_proj.weight", True), ("attn.c_proj.bias", False),
                 ("ln_2.weight", False), ("ln_2.bias", False), ("mlp.c_fc.weight", True),
                 ("mlp.c_fc.bias", False), ("mlp.c_proj.weight", True), ("mlp.c_proj.bias", False)]
    parts = [wte, hf["wpe.weight"]]
    for name, transposed in per_layer:
        for l in range(L):
            t = hf[f"h.{l}.{name}"]
            parts.append(t.T if transposed else t)
    parts += [hf["ln_f.weight"], hf["ln_f.bias"]]
    want_params = np.concatenate([np.ascontiguousarray(p).reshape(-1) for p in parts])
    if params.shape != want_params.shape or not np.array_equal(params, want_params):
        return ["llm.c parameters differ from the HF export"]
    return []


def main():
    pentad, recipe, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    overrides = sys.argv[4:]
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    sets = [a for o in overrides for a in ("--set", o)]
    torch.set_num_threads(2)

    run([pentad, "reference", recipe, "--out", work / "ref", "--steps", 1, *sets])
    run([pentad, "train", recipe, *sets, "--set", "train.steps=1", "--set", "optim.lr=1e-30",
         "--set", "optim.weight_decay=0", "--set", "train.eval_every=0",
         "--set", "train.save_every=1", "--set", f"train.ckpt_dir={work / 'ckpt'}",
         "--set", f"train.out_dir={work / 'run'}"])
    ckpt = newest_checkpoint(work / "ckpt")
    run([pentad, "ckpt", "convert", "--to", "hf", ckpt, work / "hf"])

    ref_manifest = json.loads((work / "ref" / "manifest.json").read_text())
    import tomllib
    cfg = tomllib.loads(ref_manifest["recipe"])
    init = {e["name"]: np.load(work / "ref" / f"init.{e['name']}.npy") for e in ref_manifest["params"]}
    hf = {k: v.numpy() for k, v in load_file(str(work / "hf" / "model.safetensors")).items()}
    config = json.loads((work / "hf" / "config.json").read_text())
    failures = []

    # (a) every exported tensor, through the independent name map.
    want = expected_hf(init, cfg)
    if set(hf) != set(want):
        failures.append(f"tensor names: extra {sorted(set(hf) - set(want))}, "
                        f"missing {sorted(set(want) - set(hf))}")
    worst = 0.0
    for name in sorted(set(hf) & set(want)):
        if hf[name].shape != want[name].shape:
            failures.append(f"{name}: shape {hf[name].shape} != {want[name].shape}")
            continue
        diff = float(np.abs(hf[name].astype(np.float64) - want[name]).max(initial=0.0))
        worst = max(worst, diff)
        if diff > WEIGHT_ATOL:
            failures.append(f"{name}: max |diff| {diff:.2e}")
    print(f"tensors: {len(hf)} exported, worst |diff| against init {worst:.2e}")

    # (b) logits of the transformers-convention model on pentad's first batch.
    tokens = torch.tensor(np.load(work / "ref" / "inputs.0.0.npy")).long()
    weights = {k: torch.tensor(v) for k, v in hf.items()}
    with torch.no_grad():
        logits = (gpt2_logits if config["model_type"] == "gpt2" else llama_logits)(weights, config, tokens)
    err = rel_err(logits, np.load(work / "ref" / "logits.npy"))
    print(f"logits: rel err {err:.2e} ({'ok' if err <= TOL else 'FAIL'})")
    if err > TOL:
        failures.append("logits")

    # 4. import and export again: the same bytes.
    run([pentad, "ckpt", "convert", "--from", "hf", work / "hf", work / "imported"])
    run([pentad, "ckpt", "convert", "--to", "hf", newest_checkpoint(work / "imported"), work / "hf2"])
    again = {k: v.numpy() for k, v in load_file(str(work / "hf2" / "model.safetensors")).items()}
    if set(again) != set(hf) or any(again[k].tobytes() != hf[k].tobytes() for k in hf):
        failures.append("export -> import -> export changed tensors")
    if json.loads((work / "hf2" / "config.json").read_text()) != config:
        failures.append("export -> import -> export changed config.json")

    # 5. llm.c (GPT-2 only).
    if config["model_type"] == "gpt2":
        run([pentad, "ckpt", "convert", "--to", "llmc", ckpt, work / "model.bin"])
        failures += check_llmc(work / "model.bin", hf, config)

    if failures:
        print("FAILED:", "; ".join(failures))
        sys.exit(1)
    print("hf export matches")


if __name__ == "__main__":
    main()
