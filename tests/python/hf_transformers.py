#!/usr/bin/env python3
"""pentad <-> Hugging Face checked with the real transformers library, not a model
written here: a hand-written model would share the exporter's assumptions.

Export cases (NAME = gpt2-tied, gpt2-untied, llama-mha-tied, llama-mha-untied,
llama-gqa-tied, llama-gqa-untied, mixtral-gqa-untied, mixtral-top1-tied):
1. `pentad train` a few steps and save a checkpoint;
2. `pentad reference --checkpoint` dumps a batch and pentad's logits on it from the
   checkpoint's weights;
3. `pentad ckpt convert --to hf`, then AutoModelForCausalLM.from_pretrained with
   output_loading_info: the class the recipe calls for (an MoE llama is a Mixtral), no
   missing, unexpected or mismatched keys, the head tied exactly when the recipe ties it,
   and fp32 logits within TOL of pentad's.

Import cases (NAME = gpt2-import, gpt2-untied-import, llama-gqa-import, mixtral-import):
1. transformers builds a small model with every parameter perturbed (so biases and norms
   are not their 0 / 1 initialisation) and save_pretrained writes it;
2. `pentad ckpt convert --from hf` imports it (with a small tokenizer.json beside it, which
   it copies and names as data.tokenizer; data.source = "none" makes training from the
   recipe refuse until data is named) and writes ROOT/recipe.toml, which
   `pentad ckpt inspect` prints back (and `--recipe` alone, byte for byte);
3. pentad's logits on its batch (`pentad reference --checkpoint`) are within TOL of
   transformers';
4. `pentad train ROOT/recipe.toml --resume ROOT/step-0` trains a few steps: finite losses,
   the first equal to transformers' cross-entropy on the same batch.

usage: hf_transformers.py PENTAD RECIPES_DIR WORKDIR NAME [NAME ...]
Prints "transformers loads pentad's exports and pentad transformers' models" on success.
"""
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

os.environ["HF_HUB_OFFLINE"] = "1"  # local directories only: never look for a hub
import transformers  # noqa: E402
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, MixtralConfig, MixtralForCausalLM)

TOL = 1e-5  # logits and losses, relative (norm-wise)
TRAIN_STEPS = 3
# Small, fast, and the same batch shape for every run.
COMMON = ["data.source=random", "train.micro_batch=2", "train.seq_len=32", "train.threads=2",
          "train.eval_every=0"]

EXPORTS = {
    "gpt2-tied": ("gpt-tiny.toml", ["model.tie_embeddings=true"]),
    "gpt2-untied": ("gpt-tiny.toml", ["model.tie_embeddings=false"]),
    "llama-mha-tied": ("llama-tiny.toml", ["model.n_kv_head=0", "model.tie_embeddings=true"]),
    "llama-mha-untied": ("llama-tiny.toml", ["model.n_kv_head=0", "model.tie_embeddings=false"]),
    "llama-gqa-tied": ("llama-tiny.toml", ["model.n_kv_head=2", "model.tie_embeddings=true"]),
    "llama-gqa-untied": ("llama-tiny.toml", ["model.n_kv_head=2", "model.tie_embeddings=false"]),
    # Mixtral: experts in every layer, softmax top-k renormalised (pentad's defaults); the
    # experts' own width, and top-1 routing with the experts as wide as the LLaMA MLP.
    "mixtral-gqa-untied": ("llama-tiny.toml", [
        "model.moe_layers=all", "model.n_experts=4", "model.top_k=2", "model.d_ff_expert=96",
        "model.n_kv_head=2", "model.tie_embeddings=false", "moe.aux_loss_coef=0.01"]),
    "mixtral-top1-tied": ("llama-tiny.toml", [
        "model.moe_layers=all", "model.n_experts=4", "model.top_k=1", "model.n_kv_head=0",
        "model.tie_embeddings=true"]),
}
# The transformers class each kind of recipe exports to.
EXPORT_CLASS = {"gpt-tiny.toml": "GPT2LMHeadModel", "llama-tiny.toml": "LlamaForCausalLM"}

IMPORTS = {
    "gpt2-import": lambda: GPT2LMHeadModel(GPT2Config(
        vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0)),
    "gpt2-untied-import": lambda: GPT2LMHeadModel(GPT2Config(
        vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False)),
    "llama-gqa-import": lambda: LlamaForCausalLM(LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=10000.0, attn_implementation="eager")),
    # An expert width of its own, GQA, 4 experts with 2 per token on both layers.
    "mixtral-import": lambda: MixtralForCausalLM(MixtralConfig(
        vocab_size=96, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=10000.0, num_local_experts=4, num_experts_per_tok=2,
        router_aux_loss_coef=0.02, attn_implementation="eager")),
}


def rel_err(a, b):
    a = torch.as_tensor(np.asarray(a), dtype=torch.float64)
    b = torch.as_tensor(np.asarray(b), dtype=torch.float64)
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run(*cmd):
    cmd = [str(c) for c in cmd]
    print("+", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True).stdout
    return out


def sets(overrides):
    return [a for o in overrides for a in ("--set", o)]


def newest_checkpoint(root):
    dirs = sorted(d for d in Path(root).glob("step-*")
                  if (d / "manifest.json").exists() and not d.name.endswith(".partial"))
    if not dirs:
        sys.exit(f"no committed checkpoint under {root}")
    return dirs[-1]


def reference(pentad, recipe, checkpoint, out, overrides):
    """pentad's first batch (b, t), its logits (b, t, V) and loss from the checkpoint's weights."""
    run(pentad, "reference", recipe, "--out", out, "--steps", 1, "--checkpoint", checkpoint,
        *sets(overrides))
    tokens = torch.tensor(np.load(out / "inputs.0.0.npy")).long()
    targets = torch.tensor(np.load(out / "targets.0.0.npy")).long()
    manifest = json.loads((out / "manifest.json").read_text())
    return tokens, targets, np.load(out / "logits.npy"), manifest["first_loss"]


def hf_logits(model, tokens):
    model.eval()
    with torch.no_grad():
        return model(tokens).logits.float()


def pentad_aux_coef(config):
    """moe.aux_loss_coef for transformers' router_aux_loss_coef: the same gradients, since
    transformers pools the L layers' tokens into one term without pentad's 1 / k."""
    return config.router_aux_loss_coef * config.num_experts_per_tok / config.num_hidden_layers


def switch_aux_loss(model, tokens):
    """pentad's moe.aux_loss_coef term (src/model/moe.h), from transformers' router: per
    layer coef * E / (k T^2) * sum_e count_e * sum_t p[t, e], summed over the layers, with
    T tokens, p the softmax scores and count_e the tokens whose top k holds e. Also
    transformers' own router_aux_loss_coef term, which pools the layers' tokens and has no
    1 / k."""
    config = model.config
    E, k = config.num_local_experts, config.num_experts_per_tok
    model.eval()
    with torch.no_grad():
        router_logits = model(tokens, output_router_logits=True).router_logits
    ours = 0.0
    for logits in router_logits:  # (T, E) per layer
        p = torch.softmax(logits.double(), dim=-1)
        count = torch.bincount(p.topk(k, dim=-1).indices.reshape(-1), minlength=E).double()
        T = p.shape[0]
        ours += pentad_aux_coef(config) * E / (k * T * T) * (count * p.sum(0)).sum().item()
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    theirs = config.router_aux_loss_coef * load_balancing_loss_func(router_logits, E, k).item()
    return ours, theirs


def head_is_tied(model):
    return model.get_output_embeddings().weight.data_ptr() == \
        model.get_input_embeddings().weight.data_ptr()


def check_export(pentad, recipes, work, name):
    recipe_file, extra = EXPORTS[name]
    recipe = Path(recipes) / recipe_file
    overrides = COMMON + extra
    failures = []
    run(pentad, "train", recipe, *sets(overrides), "--set", f"train.steps={TRAIN_STEPS}",
        "--set", "optim.warmup_steps=1", "--set", f"train.save_every={TRAIN_STEPS}",
        "--set", f"train.ckpt_dir={work / 'ckpt'}", "--set", f"train.out_dir={work / 'run'}")
    ckpt = newest_checkpoint(work / "ckpt")
    tokens, _, logits, _ = reference(pentad, recipe, ckpt, work / "ref", overrides)
    print(run(pentad, "ckpt", "convert", "--to", "hf", ckpt, work / "hf").strip())

    model, info = AutoModelForCausalLM.from_pretrained(
        work / "hf", output_loading_info=True, torch_dtype=torch.float32,
        attn_implementation="eager")
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if info[kind]:
            failures.append(f"{kind}: {info[kind]}")
    want_class = "MixtralForCausalLM" if "model.moe_layers=all" in extra \
        else EXPORT_CLASS[recipe_file]
    if type(model).__name__ != want_class:
        failures.append(f"transformers made a {type(model).__name__}, not a {want_class}")
    tied = "model.tie_embeddings=true" in extra
    if head_is_tied(model) != tied:
        failures.append(f"transformers {'ties' if head_is_tied(model) else 'unties'} the head; "
                        f"the recipe {'ties' if tied else 'unties'} it")
    err = rel_err(hf_logits(model, tokens), logits)
    print(f"{name}: {type(model).__name__}, loading info {info}, logits rel err {err:.2e}")
    if not err <= TOL:
        failures.append(f"logits rel err {err:.2e} > {TOL}")
    return failures


def check_import(pentad, recipes, work, name):
    failures = []
    torch.manual_seed(0)
    model = IMPORTS[name]()
    with torch.no_grad():  # every parameter away from its 0 / 1 / tied initialisation
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(work / "hf")
    # A byte-level BPE small enough for the tiny vocabulary: the printable ASCII bytes.
    vocab = {chr(c): i for i, c in enumerate(range(ord("!"), ord("~") + 1))}
    added = [{"id": len(vocab), "content": "<|endoftext|>", "special": True}]
    vocab["<|endoftext|>"] = len(vocab)
    (work / "hf" / "tokenizer.json").write_text(json.dumps({
        "added_tokens": added, "normalizer": None, "pre_tokenizer": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": []}}))

    root = work / "imported"
    summary = run(pentad, "ckpt", "convert", "--from", "hf", work / "hf", root).strip()
    print(summary)
    recipe = root / "recipe.toml"
    if not recipe.exists() or str(recipe) not in summary:
        failures.append(f"convert --from hf wrote no {recipe} or did not say so")
        return failures
    ckpt = newest_checkpoint(root)

    # The recipe names the imported tokenizer, copied beside the checkpoint, and no data:
    # training from it as written refuses, naming the keys to set.
    copied = (root / "tokenizer.json").resolve()
    if not copied.exists() or copied.read_bytes() != (work / "hf" / "tokenizer.json").read_bytes():
        failures.append(f"convert --from hf did not copy tokenizer.json to {copied}")
    for line in (f'tokenizer = "{copied}"', 'source = "none"'):
        if line not in recipe.read_text().splitlines():
            failures.append(f"recipe.toml has no line '{line}'")
    refused = subprocess.run([str(pentad), "train", str(recipe), "--resume", str(ckpt),
                              "--set", f"train.out_dir={work / 'refused'}"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if refused.returncode == 0 or "data.path" not in refused.stdout or \
            "data.source" not in refused.stdout:
        failures.append("training from the imported recipe without data did not refuse naming "
                        f"data.source and data.path:\n{refused.stdout[-2000:]}")

    # inspect prints the recorded recipe, and --recipe prints it alone, as the file holds it.
    text = recipe.read_text()
    inspected = run(pentad, "ckpt", "inspect", ckpt)
    config = model.config
    tied = config.tie_word_embeddings
    kv_heads = getattr(config, "num_key_value_heads", 0)
    family = "gpt2" if config.model_type == "gpt2" else "llama"  # Mixtral: an MoE llama
    for line in ("[model]", f'family = "{family}"',
                 f"tie_embeddings = {'true' if tied else 'false'}",
                 f"vocab_size = {config.vocab_size}"):
        if line not in inspected:
            failures.append(f"ckpt inspect does not show the recipe line '{line}'")
    want_lines = [f"n_kv_head = {kv_heads}"] if kv_heads else []
    if config.model_type == "mixtral":  # Mixtral's routing, spelled in pentad's keys
        want_lines += ['moe_layers = "all"', f"n_experts = {config.num_local_experts}",
                       f"top_k = {config.num_experts_per_tok}",
                       f"d_ff_expert = {config.intermediate_size}", 'score = "softmax"',
                       "renormalize = true"]
        coef = [l for l in text.splitlines() if l.startswith("aux_loss_coef = ")]
        if not coef or abs(float(coef[0].split("=")[1]) / pentad_aux_coef(config) - 1) > 1e-6:
            failures.append(f"recipe.toml's aux_loss_coef {coef} is not "
                            f"{pentad_aux_coef(config)} (router_aux_loss_coef * k / L)")
    for line in want_lines:
        if line not in text.splitlines():
            failures.append(f"recipe.toml has no line '{line}'")
    if run(pentad, "ckpt", "inspect", ckpt, "--recipe") != text:
        failures.append("ckpt inspect --recipe differs from recipe.toml")

    tokens, targets, logits, first_loss = reference(pentad, recipe, ckpt, work / "ref", COMMON)
    want = hf_logits(model, tokens)
    err = rel_err(logits, want)
    hf_loss = F.cross_entropy(want.reshape(-1, want.shape[-1]), targets.reshape(-1)).item()
    print(f"{name}: logits rel err {err:.2e}, loss pentad {first_loss:.6f} transformers "
          f"{hf_loss:.6f}")
    if not err <= TOL:
        failures.append(f"logits rel err {err:.2e} > {TOL}")

    # Training starts from the imported weights (no optimizer state): its first loss is
    # transformers' loss on the same batch.
    run(pentad, "train", recipe, "--resume", ckpt, *sets(COMMON),
        "--set", f"train.steps={TRAIN_STEPS}", "--set", "optim.warmup_steps=1",
        "--set", f"train.out_dir={work / 'run'}")
    steps = [json.loads(l) for l in (work / "run" / "metrics.jsonl").read_text().splitlines()
             if '"loss"' in l]
    losses = [m["loss"] for m in steps]
    print(f"{name}: pentad trains from the import: losses {[round(x, 5) for x in losses]}")
    if len(losses) != TRAIN_STEPS or not all(math.isfinite(x) for x in losses):
        failures.append(f"training losses {losses}")
    elif not abs(losses[0] - hf_loss) <= TOL * abs(hf_loss):
        failures.append(f"first training loss {losses[0]} != transformers' {hf_loss}")
    if config.model_type == "mixtral" and steps:
        # The balancing loss with router_aux_loss_coef as moe.aux_loss_coef: pentad's term on
        # transformers' router scores and picks (the same batch, one micro-batch).
        want_aux, hf_aux = switch_aux_loss(model, tokens)
        aux = steps[0].get("moe_aux_loss", float("nan"))
        print(f"{name}: first step's aux loss pentad {aux:.8f}, from transformers' router "
              f"{want_aux:.8f} (transformers' own load_balancing_loss term: {hf_aux:.8f})")
        if not abs(aux - want_aux) <= TOL * abs(want_aux):
            failures.append(f"first step's aux loss {aux} != {want_aux} from transformers' router")
    return failures


def main():
    pentad, recipes, root = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    names = sys.argv[4:]
    unknown = [n for n in names if n not in EXPORTS and n not in IMPORTS]
    if not names or unknown:
        sys.exit(f"cases: {sorted(EXPORTS) + sorted(IMPORTS)}; unknown: {unknown}")
    torch.set_num_threads(2)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    failed = []
    for name in names:
        work = root / name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        check = check_export if name in EXPORTS else check_import
        try:
            failed += [f"{name}: {f}" for f in check(pentad, recipes, work, name)]
        except subprocess.CalledProcessError as e:  # the other cases still run
            failed.append(f"{name}: {e}\n{e.stdout}")
        except Exception as e:  # noqa: BLE001 (transformers refusing a directory, say)
            failed.append(f"{name}: {type(e).__name__}: {e}")
    if failed:
        print("FAILED:\n  " + "\n  ".join(failed))
        sys.exit(1)
    print("transformers loads pentad's exports and pentad transformers' models")


if __name__ == "__main__":
    main()
