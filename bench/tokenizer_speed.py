#!/usr/bin/env python3
"""pentad's encode_batch against the `tokenizers` library's, on the fortune corpus.

Trains a GPT-2-style and a LLaMA-3-style byte-level BPE (16384 tokens) with `tokenizers` on
the Debian fortunes plus the multilingual corpus of tests/python/tokenizer_ids.py, then
encodes 4 copies of the fortunes (one document per fortune) and 100000 multilingual
documents both ways, best of 3: pentad's time is `pentad tokenizer encode`'s own timing of
encode_batch (reading and writing excluded), the library's its `encode_batch` called from
Python. Every document's ids must agree. Threads: OMP_NUM_THREADS / RAYON_NUM_THREADS
(default 2 each).

usage: .venv/bin/python bench/tokenizer_speed.py PENTAD WORKDIR
"""
import glob
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "2")
os.environ.setdefault("OMP_NUM_THREADS", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))
import tokenizer_ids as corpus  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def fortunes():
    docs = []
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if path.endswith((".dat", ".u8")):
            continue
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, IsADirectoryError):
            continue
        docs += [d.strip("\n") for d in text.split("\n%\n") if d.strip()]
    return docs


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    pentad, work = sys.argv[1], Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    base = fortunes()
    multi = corpus.make_corpus(100000, seed=11)
    for name, llama3 in (("gpt2", False), ("llama3", True)):
        corpus.train_byte_level(base + multi[:20000], llama3, 16384).save(str(work / f"{name}.json"))
    for label, docs in (("fortunes x4", base * 4), ("multilingual", multi)):
        jsonl = "".join(json.dumps(d) + "\n" for d in docs).encode()
        mb = sum(len(d.encode()) for d in docs) / 1e6
        for name in ("gpt2", "llama3"):
            tok = Tokenizer.from_file(str(work / f"{name}.json"))
            tok.encode_special_tokens = True
            lib = pen = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                want = tok.encode_batch(docs, add_special_tokens=False)
                lib = min(lib, time.perf_counter() - start)
                out = subprocess.run([pentad, "tokenizer", "encode", work / f"{name}.json"],
                                     input=jsonl, capture_output=True, check=True)
                pen = min(pen, float(re.search(rb"in ([0-9.]+) s", out.stderr).group(1)))
            got = [[int(t) for t in l.split()] for l in out.stdout.decode().split("\n")[:-1]]
            same = sum(g == w.ids for g, w in zip(got, want))
            print(f"{label} {name}: {len(docs)} documents, {mb:.1f} MB: pentad {mb / pen:.1f} "
                  f"MB/s, tokenizers {mb / lib:.1f} MB/s; identical ids {same}/{len(docs)}")


if __name__ == "__main__":
    main()
