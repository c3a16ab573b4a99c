#!/usr/bin/env python3
"""Writes a token shard in llm.c's format, so llm.c and pentad can train on the same tokens
on a machine with no network (bench/RESULTS.md, "GPU: pending", runs llm.c on it).

The format (llm.c's dev/data/data_common.py; pentad reads it as data.source = "llmc"):
    header: 256 little-endian int32: [0] magic 20240520, [1] version 1, [2] token count
    then:   the tokens, little-endian uint16
The tokens are either uniform random ids in [0, --vocab) from --seed (numpy's PCG64, so the
same arguments give the same file anywhere), or the token stream of a pentad / Megatron
token file (PREFIX.bin + PREFIX.idx, as pentad writes data/fortunes-bpe<V>.*), whole or
its first --tokens.

usage:
  python3 bench/make_llmc_shard.py OUT.bin --random --tokens 2000000 --vocab 50257 [--seed 1]
  python3 bench/make_llmc_shard.py OUT.bin --from-megatron data/fortunes-bpe512 [--tokens N]
"""
import argparse
import struct
import sys
from pathlib import Path

import numpy as np

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256
# Megatron's indexed_dataset dtype codes (src/data/token_files.h): the integer ones.
MEGATRON_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}


def random_tokens(count, vocab, seed):
    return np.random.Generator(np.random.PCG64(seed)).integers(0, vocab, size=count, dtype=np.int64)


def megatron_tokens(prefix, count):
    """Every token of PREFIX.bin in file order (the documents back to back), or the first count."""
    idx = Path(prefix + ".idx").read_bytes()
    if idx[:9] != b"MMIDIDX\x00\x00":
        sys.exit(f"{prefix}.idx: not a Megatron index (no MMIDIDX magic)")
    (version,) = struct.unpack_from("<Q", idx, 9)
    dtype_code = idx[17]
    if version != 1 or dtype_code not in MEGATRON_DTYPES:
        sys.exit(f"{prefix}.idx: version {version}, dtype code {dtype_code}: not understood")
    tokens = np.memmap(prefix + ".bin", dtype=MEGATRON_DTYPES[dtype_code], mode="r")
    return np.asarray(tokens[:count] if count else tokens, dtype=np.int64)


def write_shard(path, tokens):
    if tokens.size == 0 or tokens.size > 2**31 - 1:
        sys.exit(f"{tokens.size} tokens: an llm.c shard holds 1 to 2^31 - 1")
    if tokens.min() < 0 or tokens.max() > 65535:
        sys.exit(f"token ids {tokens.min()}..{tokens.max()} do not fit llm.c's uint16 (version 1)")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = [MAGIC, VERSION, tokens.size]
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())
    tmp.replace(path)  # whole or not at all


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the shard to write (e.g. bench/out/llmc/random_train_000000.bin)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--random", action="store_true", help="uniform random tokens")
    src.add_argument("--from-megatron", metavar="PREFIX", help="a pentad/Megatron token file")
    ap.add_argument("--tokens", type=int, default=0,
                    help="token count (needed with --random; default for a file: all of it)")
    ap.add_argument("--vocab", type=int, default=50257, help="--random ids are below this")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    if a.random:
        if a.tokens <= 0:
            sys.exit("--random needs --tokens N")
        tokens = random_tokens(a.tokens, a.vocab, a.seed)
        what = f"random ids below {a.vocab}, seed {a.seed}"
    else:
        tokens = megatron_tokens(a.from_megatron, a.tokens)
        what = f"{a.from_megatron}.bin"
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    write_shard(a.out, tokens)
    print(f"{a.out}: {tokens.size:,} tokens ({what}), {Path(a.out).stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
