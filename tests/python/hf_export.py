#!/usr/bin/env python3
"""pentad's Hugging Face export as files: the bitwise round trip and llm.c's model file.
Whether transformers loads the export, and computes pentad's logits from it, is
tests/python/hf_transformers.py's part, with the real library.

1. `pentad train` runs one step and saves a checkpoint; `pentad ckpt convert --to hf
   CHECKPOINT_DIR OUT_DIR` exports it.
2. `pentad ckpt convert --from hf OUT_DIR ROOT` imports the export again and a second
   export must give the same bytes for every tensor (and the same config.json).
3. GPT-2 only: `pentad ckpt convert --to llmc CHECKPOINT_DIR FILE` writes llm.c's model
   file; its header and parameter order are checked against the exported tensors.

usage: hf_export.py PENTAD RECIPE WORKDIR [section.key=value ...]
Prints "hf export matches" on success.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file


def run(cmd):
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True)


def newest_checkpoint(root):
    dirs = sorted(d for d in Path(root).glob("step-*") if (d / "manifest.json").exists()
                  and not d.name.endswith(".partial"))
    if not dirs:
        sys.exit(f"no committed checkpoint under {root}")
    return dirs[-1]


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
    wte[:V] = hf["transformer.wte.weight"]
    # llm.c's weights are (out, in): the transpose of HF's Conv1D [in, out].
    per_layer = [("ln_1.weight", False), ("ln_1.bias", False), ("attn.c_attn.weight", True),
                 ("attn.c_attn.bias", False), ("attn.c_proj.weight", True), ("attn.c_proj.bias", False),
                 ("ln_2.weight", False), ("ln_2.bias", False), ("mlp.c_fc.weight", True),
                 ("mlp.c_fc.bias", False), ("mlp.c_proj.weight", True), ("mlp.c_proj.bias", False)]
    parts = [wte, hf["transformer.wpe.weight"]]
    for name, transposed in per_layer:
        for l in range(L):
            t = hf[f"transformer.h.{l}.{name}"]
            parts.append(t.T if transposed else t)
    parts += [hf["transformer.ln_f.weight"], hf["transformer.ln_f.bias"]]
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

    run([pentad, "train", recipe, *sets, "--set", "train.steps=1", "--set", "train.eval_every=0",
         "--set", "train.save_every=1", "--set", f"train.ckpt_dir={work / 'ckpt'}",
         "--set", f"train.out_dir={work / 'run'}"])
    ckpt = newest_checkpoint(work / "ckpt")
    run([pentad, "ckpt", "convert", "--to", "hf", ckpt, work / "hf"])
    hf = load_file(str(work / "hf" / "model.safetensors"))
    config = json.loads((work / "hf" / "config.json").read_text())
    failures = []

    # 2. import and export again: the same bytes.
    run([pentad, "ckpt", "convert", "--from", "hf", work / "hf", work / "imported"])
    run([pentad, "ckpt", "convert", "--to", "hf", newest_checkpoint(work / "imported"), work / "hf2"])
    again = load_file(str(work / "hf2" / "model.safetensors"))
    if set(again) != set(hf) or any(again[k].tobytes() != hf[k].tobytes() for k in hf):
        failures.append("export -> import -> export changed tensors")
    if json.loads((work / "hf2" / "config.json").read_text()) != config:
        failures.append("export -> import -> export changed config.json")

    # 3. llm.c (GPT-2 only).
    if config["model_type"] == "gpt2":
        run([pentad, "ckpt", "convert", "--to", "llmc", ckpt, work / "model.bin"])
        failures += check_llmc(work / "model.bin", hf, config)

    if failures:
        print("FAILED:", "; ".join(failures))
        sys.exit(1)
    print("hf export matches")


if __name__ == "__main__":
    main()
