#!/usr/bin/env python3
"""Tokenizing throughput: `pentad data prepare --threads 2` against the Hugging Face
`tokenizers` library's batch encoding (RAYON_NUM_THREADS=2) on the same JSONL corpus and
tokenizer.json. Both read the same file; tokenizers' time includes reading and parsing the
JSONL in Python but not writing ids, pentad's includes writing the .bin/.idx.

usage: bench/data_prepare.py PENTAD WORKDIR [--mb 200] [--rounds 3] [--vocab 8192]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

FORTUNES = Path("/usr/share/games/fortunes")
WORDS = ("Grüße naïve café façade 日本語 テキスト 中文 文本 Привет мир дела ελληνικά "
         "λέξεις العربية كلمة हिन्दी शब्द 12345 3.14159 x=f(y)+1; the of and to in").split()


def fortunes():
    docs = []
    for path in sorted(FORTUNES.iterdir()):
        if path.is_file() and path.suffix not in (".dat", ".u8"):
            text = path.read_text(encoding="utf-8", errors="replace")
            docs += [d.strip("\n") for d in text.split("\n%\n") if d.strip()]
    return docs


def make_corpus(path, megabytes):
    rng = random.Random(0)
    base = fortunes()
    written, target = 0, megabytes * 1_000_000
    with path.open("w", encoding="utf-8") as out:
        while written < target:
            doc = rng.choice(base)
            if rng.random() < 0.3:  # generated multilingual text, varied
                doc += "\n" + " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 200)))
            line = json.dumps({"text": doc}, ensure_ascii=False) + "\n"
            out.write(line)
            written += len(line.encode())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pentad")
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    corpus = args.workdir / f"corpus-{args.mb}mb.jsonl"
    if not corpus.exists():
        make_corpus(corpus, args.mb)
    tok = args.workdir / f"tok-{args.vocab}.json"
    if not tok.exists():
        sources = [p for p in sorted(FORTUNES.iterdir()) if p.is_file() and p.suffix not in (".dat", ".u8")]
        subprocess.run([args.pentad, "tokenizer", "train", *sources, "-v", str(args.vocab),
                        "-o", tok], check=True, capture_output=True)
    megabytes = corpus.stat().st_size / 1e6

    from tokenizers import Tokenizer
    os.environ["RAYON_NUM_THREADS"] = "2"
    hf = Tokenizer.from_file(str(tok))
    pentad_rates, hf_rates = [], []
    for _ in range(args.rounds):  # interleaved, so load changes hit both
        start = time.perf_counter()
        out = subprocess.run([args.pentad, "data", "prepare", corpus, "-t", tok, "-o",
                              args.workdir / "out", "--threads", "2"], check=True,
                             capture_output=True, text=True).stdout
        pentad_rates.append(megabytes / (time.perf_counter() - start))
        start = time.perf_counter()
        batch, tokens = [], 0
        with corpus.open(encoding="utf-8") as f:
            for line in f:
                batch.append(json.loads(line)["text"])
                if len(batch) == 10000:
                    tokens += sum(len(e.ids) for e in hf.encode_batch(batch, add_special_tokens=False))
                    batch = []
        if batch:
            tokens += sum(len(e.ids) for e in hf.encode_batch(batch, add_special_tokens=False))
        hf_rates.append(megabytes / (time.perf_counter() - start))
        # The same work: pentad's tokens are tokenizers' plus one <|endoftext|> a document.
        docs, pentad_tokens = [int(w.split()[0]) for w in out.split(",")[1:3]]
        if pentad_tokens != tokens + docs:
            sys.exit(f"token counts differ: pentad {pentad_tokens}, tokenizers {tokens} + {docs}")
    p, h = statistics.median(pentad_rates), statistics.median(hf_rates)
    print(f"corpus {megabytes:.0f} MB, vocab {args.vocab}, {args.rounds} rounds, load {os.getloadavg()[0]:.2f}")
    print(f"pentad data prepare --threads 2: median {p:.1f} MB/s (runs {', '.join(f'{r:.1f}' for r in pentad_rates)})")
    print(f"tokenizers encode_batch (2 threads): median {h:.1f} MB/s (runs {', '.join(f'{r:.1f}' for r in hf_rates)})")
    print(f"ratio pentad / tokenizers: {p / h:.2f}x")


main()
