#!/usr/bin/env python3
"""A checkpoint carries its run's tokenizer, and an HF export writes it (issue 45).

1. `pentad train` gpt-tiny on the bundled fortunes (its learned byte-level BPE) and saves;
   the checkpoint holds tokenizer.json, with its sha256 in manifest.json.
2. `pentad generate --prompt` from another directory works (the recipe's tokenizer path is
   relative to the run's directory), and stdout holds the continuation alone.
3. `ckpt convert --to hf` writes tokenizer.json and tokenizer_config.json:
   AutoTokenizer.from_pretrained loads them, encodes every document to the ids pentad gives
   and decodes them back, and its eos token is pentad's end-of-text.
4. The same with a SentencePiece model (data.tokenizer = a .model file): the export holds
   tokenizer.model, no tokenizer.json, says so, and sentencepiece encodes with the exported
   file as pentad does.

usage: hf_tokenizer_export.py PENTAD RECIPES_DIR WORKDIR
Prints "hf tokenizer export matches" on success.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # local directories only: never look for a hub
import sentencepiece as spm  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

DOCS = ["You will meet a tall, dark stranger.", "Über naïve café — 123 €", "  two  spaces\tand a tab",
        "日本語のテキスト", "emoji 🙂 and\nnewlines\n\n", "it's, we'll, they've: contractions"]
TRAIN = ["train.steps=2", "train.save_every=2", "train.micro_batch=2", "train.seq_len=32",
         "train.threads=2", "train.eval_every=0", "optim.warmup_steps=1"]


def run(*cmd, cwd=None):
    cmd = [str(c) for c in cmd]
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"exit {r.returncode}: {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r


def pentad_ids(pentad, tokenizer, docs):
    r = subprocess.run([str(pentad), "tokenizer", "encode", str(tokenizer)],
                       input="".join(json.dumps(d) + "\n" for d in docs), capture_output=True,
                       text=True, check=True)
    return [[int(x) for x in line.split()] for line in r.stdout.splitlines()]


def train(pentad, recipe, work, extra):
    work.mkdir(parents=True)
    run(pentad, "train", recipe, *TRAIN, *extra, cwd=work)
    return work / "runs" / "gpt-tiny" / "checkpoints" / "step-00000002"


def check_bpe(pentad, recipes, work, failures):
    ckpt = train(pentad, recipes / "gpt-tiny.toml", work / "bpe",
                 ["train.out_dir=runs/gpt-tiny"])
    manifest = json.loads((ckpt / "manifest.json").read_text())
    carried = ckpt / "tokenizer.json"
    digest = hashlib.sha256(carried.read_bytes()).hexdigest() if carried.exists() else None
    if manifest.get("tokenizer") != {"file": "tokenizer.json", "sha256": digest}:
        failures.append(f"manifest tokenizer {manifest.get('tokenizer')}, file sha256 {digest}")
    shown = run(pentad, "ckpt", "inspect", "--verify", ckpt).stdout
    if f"tokenizer.json  tokenizer, sha256 {digest} (verified)" not in shown:
        failures.append("ckpt inspect --verify does not show the tokenizer checked")
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    gen = run(pentad, "generate", ckpt.resolve(), "--prompt", "You will", "--max-tokens", "8",
              cwd=elsewhere)
    if "tokens/s" in gen.stdout or "tokens/s" not in gen.stderr:
        failures.append(f"generate: the summary is not on stderr alone: {gen.stdout!r}")
    hf = work / "hf-bpe"
    summary = run(pentad, "ckpt", "convert", "--to", "hf", ckpt, hf).stdout
    print(summary.strip())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (hf / name).exists():
            failures.append(f"the export has no {name}")
    tok = AutoTokenizer.from_pretrained(hf)
    ours = pentad_ids(pentad, carried, DOCS)
    theirs = [tok.encode(d, add_special_tokens=False) for d in DOCS]
    for doc, a, b in zip(DOCS, ours, theirs):
        if a != b:
            failures.append(f"bpe {doc!r}: pentad {a} != transformers {b}")
        if tok.decode(b) != doc:
            failures.append(f"bpe {doc!r} decodes to {tok.decode(b)!r}")
    r = subprocess.run([str(pentad), "tokenizer", "encode", "--special", str(carried)],
                       input=json.dumps("<|endoftext|>") + "\n", capture_output=True, text=True,
                       check=True)
    if [tok.eos_token_id] != [int(x) for x in r.stdout.split()]:
        failures.append(f"eos {tok.eos_token!r} {tok.eos_token_id}, pentad's {r.stdout.strip()}")
    print(f"bpe: {len(DOCS)} documents, pentad and transformers ids equal: "
          f"{ours == theirs}; eos {tok.eos_token!r} = {tok.eos_token_id}")


def check_sentencepiece(pentad, recipes, work, failures):
    work.mkdir(parents=True)
    prefix = work / "sp"
    words = ("you will meet a tall dark stranger fortune favours the bold today tomorrow "
             "never trust a computer you cannot throw out of a window").split()
    text = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) for i in range(500)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_prefix=str(prefix),
                                   vocab_size=300, byte_fallback=True, minloglevel=2)
    ckpt = train(pentad, recipes / "gpt-tiny.toml", work / "run",
                 ["train.out_dir=runs/gpt-tiny", f"data.tokenizer={prefix}.model"])
    hf = work / "hf-sp"
    summary = run(pentad, "ckpt", "convert", "--to", "hf", ckpt, hf).stdout
    print(summary.strip())
    if not (hf / "tokenizer.model").exists() or (hf / "tokenizer.json").exists():
        failures.append(f"sentencepiece export holds {sorted(p.name for p in hf.iterdir())}")
    if "tokenizer.model (SentencePiece" not in summary or "no tokenizer_config.json" not in summary:
        failures.append(f"the summary does not say what was written: {summary}")
    sp = spm.SentencePieceProcessor(model_file=str(hf / "tokenizer.model"))
    docs = DOCS[:3]
    ours, theirs = pentad_ids(pentad, hf / "tokenizer.model", docs), [sp.encode(d) for d in docs]
    if ours != theirs:
        failures.append(f"sentencepiece: pentad {ours} != sentencepiece {theirs}")
    print(f"sentencepiece: {len(docs)} documents, ids equal: {ours == theirs}")


def main():
    pentad, recipes, work = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), Path(
        sys.argv[3])
    shutil.rmtree(work, ignore_errors=True)
    failures = []
    check_bpe(pentad, recipes, work, failures)
    check_sentencepiece(pentad, recipes, work / "sp", failures)
    if failures:
        sys.exit("\n".join(failures))
    print("hf tokenizer export matches")


if __name__ == "__main__":
    main()
