#!/usr/bin/env python3
"""`pentad data prepare` on users' inputs: JSONL, gzip and zstd (made by the gzip and zstd tools), globs and
several files give the ids of the plain-text path, and those ids are the Hugging Face
`tokenizers` library's for the same tokenizer.json; thread counts give identical files; bad
lines are named by file:line, --skip-bad counts them, and a failed run leaves no output.

usage: data_prepare_inputs.py PENTAD WORKDIR
"""
import gzip
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

PENTAD, WORK = sys.argv[1], Path(sys.argv[2])
FORTUNES = Path("/usr/share/games/fortunes")

DOCS = [
    "Hello world.\nA second line.\n",
    "Grüße aus Köln — naïve café façade.",
    "日本語のテキストと中文文本。",
    "Emoji 🎉 and tabs\tand  spaces   end",
    "Numbers 12345 and 3.14159, code: x = f(y) + 1;\n\n",
    "Привет, мир! Как дела?",
] * 7 + [f"document {i}: " + "abc " * i for i in range(20)]


def run(*args, expect=0):
    proc = subprocess.run([PENTAD, *map(str, args)], capture_output=True, text=True, timeout=60)
    if proc.returncode != expect:
        sys.exit(f"exit {proc.returncode}, wanted {expect}: {args}\n{proc.stdout}{proc.stderr}")
    return proc.stdout + proc.stderr


def read_dataset(prefix):
    """Megatron .idx/.bin -> list of documents' ids (the format of indexed_dataset.py)."""
    idx = Path(f"{prefix}.idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00", prefix
    dtype, n = idx[17], struct.unpack_from("<Q", idx, 18)[0]
    sizes = struct.unpack_from(f"<{n}i", idx, 34)
    fmt, item = {8: ("H", 2), 4: ("i", 4)}[dtype]
    binary = Path(f"{prefix}.bin").read_bytes()
    docs, offset = [], 0
    for size in sizes:
        docs.append(list(struct.unpack_from(f"<{size}{fmt}", binary, offset)))
        offset += size * item
    return docs


def same_files(a, b):
    for ext in (".bin", ".idx"):
        if Path(f"{a}{ext}").read_bytes() != Path(f"{b}{ext}").read_bytes():
            sys.exit(f"{a}{ext} and {b}{ext} differ")


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    tok = WORK / "tok.json"
    sources = sorted(p for p in FORTUNES.iterdir() if p.is_file() and p.suffix not in (".dat", ".u8"))
    run("tokenizer", "train", *sources[:3], "-v", 600, "-o", tok)

    # The reference path: plain text, one document per file.
    txt = WORK / "txt"
    txt.mkdir()
    for i, doc in enumerate(DOCS):
        (txt / f"{i:03d}.txt").write_text(doc, encoding="utf-8")
    run("data", "prepare", f"{txt}/*.txt", "-t", tok, "-o", WORK / "plain")
    plain = read_dataset(WORK / "plain")
    assert len(plain) == len(DOCS), len(plain)

    # Against the reference library: its ids for each document, then <|endoftext|>.
    try:
        from tokenizers import Tokenizer
        hf = Tokenizer.from_file(str(tok))
        eot = hf.token_to_id("<|endoftext|>")
        for doc, ids in zip(DOCS, plain):
            want = hf.encode(doc, add_special_tokens=False).ids + [eot]
            assert ids == want, f"{doc!r}: pentad {ids} vs tokenizers {want}"
        print("plain-text ids match tokenizers")
    except ImportError:
        print("tokenizers not installed: the ids are checked across input formats only")

    lines = "".join(json.dumps({"id": i, "text": d}, ensure_ascii=i % 2 == 0) + "\n"
                    for i, d in enumerate(DOCS))
    (WORK / "docs.jsonl").write_text(lines, encoding="utf-8")
    run("data", "prepare", WORK / "docs.jsonl", "-t", tok, "-o", WORK / "jsonl")
    same_files(WORK / "plain", WORK / "jsonl")

    # gzip from the command-line tool; a glob over two files, one compressed.
    half = len(DOCS) // 2
    all_lines = lines.splitlines(keepends=True)
    (WORK / "part-a.jsonl").write_text("".join(all_lines[:half]), encoding="utf-8")
    (WORK / "part-b.jsonl").write_text("".join(all_lines[half:]), encoding="utf-8")
    subprocess.run(["gzip", "-f", WORK / "part-b.jsonl"], check=True)
    assert gzip.decompress((WORK / "part-b.jsonl.gz").read_bytes()).decode() == "".join(all_lines[half:])
    run("data", "prepare", f"{WORK}/part-*.jsonl*", "-t", tok, "-o", WORK / "glob")
    same_files(WORK / "plain", WORK / "glob")

    # zstd from the command-line tool, two frames (two files concatenated), against plain.
    (WORK / "z1.jsonl").write_text("".join(all_lines[:half]), encoding="utf-8")
    (WORK / "z2.jsonl").write_text("".join(all_lines[half:]), encoding="utf-8")
    for name in ("z1", "z2"):
        subprocess.run(["zstd", "-q", "-f", "--rm", WORK / f"{name}.jsonl"], check=True)
    (WORK / "docs.jsonl.zst").write_bytes((WORK / "z1.jsonl.zst").read_bytes() +
                                          (WORK / "z2.jsonl.zst").read_bytes())
    unzstd = subprocess.run(["zstd", "-d", "-c", WORK / "docs.jsonl.zst"], check=True,
                            capture_output=True).stdout
    assert unzstd.decode() == lines
    run("data", "prepare", WORK / "docs.jsonl.zst", "-t", tok, "-o", WORK / "zst")
    same_files(WORK / "plain", WORK / "zst")
    (WORK / "cut.jsonl.zst").write_bytes((WORK / "z1.jsonl.zst").read_bytes()[:-7])
    out = run("data", "prepare", WORK / "cut.jsonl.zst", "-t", tok, "-o", WORK / "cut", expect=2)
    assert "cut.jsonl.zst" in out and "truncated" in out, out
    assert not list(WORK.glob("cut.*.tmp*")) and not (WORK / "cut.idx").exists()

    # Thread counts: byte-identical files.
    run("data", "prepare", WORK / "docs.jsonl", "-t", tok, "-o", WORK / "t1", "--threads", 1)
    run("data", "prepare", WORK / "docs.jsonl", "-t", tok, "-o", WORK / "t2", "--threads", 2)
    same_files(WORK / "t1", WORK / "t2")

    # Fortune files, gzip-compressed: the same documents as the uncompressed file.
    fortune = WORK / "f.txt"
    fortune.write_text("%\n".join(DOCS[:6]) + "\n", encoding="utf-8")
    shutil.copy(fortune, WORK / "g.txt")
    subprocess.run(["gzip", "-f", WORK / "g.txt"], check=True)
    run("data", "prepare", fortune, "--fortune", "-t", tok, "-o", WORK / "f")
    run("data", "prepare", WORK / "g.txt.gz", "--fortune", "-t", tok, "-o", WORK / "g")
    same_files(WORK / "f", WORK / "g")

    # Bad lines: line 2 not JSON, line 4 lacks the key, line 5 a number, line 6 bad UTF-8;
    # line 8's text is empty: no document, counted apart from the bad ones.
    bad = WORK / "bad.jsonl"
    bad.write_bytes(b'{"text": "one"}\n{not json\n{"text": "three"}\n{"body": "x"}\n'
                    b'{"text": 5}\n{"text": "\xff\xfe"}\n{"text": "seven"}\n{"text": ""}\n')
    out = run("data", "prepare", bad, "-t", tok, "-o", WORK / "bad", expect=2)
    assert f"{bad}:2" in out and "--skip-bad" in out, out
    left = [p.name for p in WORK.iterdir() if p.name.startswith("bad.") and p.name != "bad.jsonl"]
    assert not left, f"a failed run left {left}"
    out = run("data", "prepare", bad, "-t", tok, "-o", WORK / "bad", "--skip-bad")
    for line in (2, 4, 5, 6):
        assert f"{bad}:{line}" in out, (line, out)
    assert "4 bad lines skipped, 1 empty texts skipped" in out, out
    assert len(read_dataset(WORK / "bad")) == 3

    # A glob that matches nothing is refused, naming it.
    out = run("data", "prepare", f"{WORK}/nothing-*.jsonl", "-t", tok, "-o", WORK / "x", expect=2)
    assert "nothing-*.jsonl" in out, out

    # --json-key, --bos and --eod.
    (WORK / "body.jsonl").write_text(json.dumps({"body": "hello"}) + "\n")
    run("data", "prepare", WORK / "body.jsonl", "--json-key", "body", "--bos", "<|endoftext|>",
        "-t", tok, "-o", WORK / "body")
    ids = read_dataset(WORK / "body")[0]
    assert ids[0] == ids[-1] == plain[0][-1] and len(ids) > 2, ids
    print("data prepare inputs behave")


main()
