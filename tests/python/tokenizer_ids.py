#!/usr/bin/env python3
"""pentad's tokenizers against the reference libraries, id for id.

The test writes a multilingual corpus (accents, CJK, Hangul, Arabic, Devanagari, emoji with
joiners and flags, long digit runs, whitespace runs, tabs, CR/LF, Unicode spaces, code,
contractions in both cases, and the special tokens' text), then trains with the libraries:
1. with `tokenizers`: a GPT-2-style byte-level BPE (ByteLevel pre-tokenizer, <|endoftext|>);
2. with `tokenizers`: a LLaMA-3-style one (Split on LLaMA-3's regex, then ByteLevel without
   its regex, ignore_merges, LLaMA-3's special tokens);
3. with `sentencepiece`: a LLaMA-2-style BPE (identity normalization, split digits, byte
   fallback) and a unigram model (NFKC, byte fallback).
4. with `pentad tokenizer train`: a byte-level BPE, which the `tokenizers` library loads.
For each, `pentad tokenizer encode` must give the library's ids on every document, both
with special tokens left as text (the default) and with --special; `pentad tokenizer
decode` must give the document back (byte-level BPE) or the library's decoding (SentencePiece).

usage: tokenizer_ids.py PENTAD WORKDIR
Prints "tokenizer ids match" on success.
"""
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import sentencepiece as spm
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>"] + [f"<|reserved_special_token_{i}|>"
                                                       for i in range(4)]

WHOLE_WORDS = [" quick", " brown", " lazy", " jumps", "Straße", " family", " square", "日本語のテキスト"]


def bytes_to_unicode():
    """GPT-2's byte alphabet (printable bytes stand for themselves, the rest from U+0100)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_UNICODE = bytes_to_unicode()

FRAGMENTS = [
    "The quick brown fox jumps over the lazy dog.", "It's what they'd said; we'll see.",
    "IT'S LOUD, WE'LL SHOUT, THEY'VE GONE", "don't", "I'M", "naïve café résumé", "Straße",
    "Ελληνικά κείμενα", "русский текст", "日本語のテキスト", "中文字符测试", "한국어 문장",
    "مرحبا بالعالم", "हिन्दी भाषा", "ภาษาไทย", "e\u0301te\u0301", "🙂🙃", "👨‍👩‍👧 family",
    "🇫🇷🇯🇵", "x²+y³", "3.14159", "1234567890", "٣٤٥", "2026-11-28", "$1,000,000.00",
    "    ", "\t\t", "\n\n\n", "\r\n", " \n ", "\u00a0non-breaking\u00a0", "\u3000全角\u3000",
    "thin\u2009space", "zero\u200bwidth", "odd\u0085\u2028\u2029\u1680\u180e\u000b\u000c\u001c\ufeff\u2060 x", "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { s += a[i]; }", "<div class=\"x\">&amp;</div>",
    "snake_case_name = CamelCase()", "--flag=value", "...!!!???", "«quoted» „text“",
    "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<s>", "</s>", "<|endoftext",
    "endoftext|>", "tab\there", "trailing   ", "   leading", "MiXeD 混合 text ✓",
]


def make_corpus(n_docs, seed):
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        parts = [rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 12))]
        seps = [" ", "", "\n", "  ", "\t", ", "]
        docs.append("".join(p + rng.choice(seps) for p in parts).rstrip("\n") or "x")
    return docs


def run_pentad(pentad, args, stdin):
    result = subprocess.run([pentad, "tokenizer", *args], input=stdin, capture_output=True,
                            text=True, encoding="utf-8")
    if result.returncode != 0:
        sys.exit(f"pentad tokenizer {' '.join(args)} failed:\n{result.stderr}")
    sys.stderr.write(result.stderr)
    return result.stdout.split("\n")[:-1]  # not splitlines(): U+2028 may be inside a line


def pentad_encode(pentad, path, docs, special):
    jsonl = "".join(json.dumps(d) + "\n" for d in docs)
    lines = run_pentad(pentad, ["encode", str(path)] + (["--special"] if special else []), jsonl)
    return [[int(t) for t in line.split()] for line in lines]


def pentad_decode(pentad, path, id_lists):
    lines = run_pentad(pentad, ["decode", str(path)],
                       "".join(" ".join(map(str, ids)) + "\n" for ids in id_lists))
    return [json.loads(line) for line in lines]


def compare(name, docs, got, want, failures):
    if len(got) != len(want):
        failures.append(f"{name}: {len(got)} documents encoded, expected {len(want)}")
        return
    bad = [i for i in range(len(docs)) if got[i] != want[i]]
    print(f"{name}: {len(docs) - len(bad)}/{len(docs)} documents identical, "
          f"{sum(len(w) for w in want)} tokens")
    for i in bad[:3]:
        failures.append(f"{name}: document {i} {docs[i]!r}\n  pentad {got[i]}\n  library {want[i]}")


def train_byte_level(docs, llama3, vocab_size):
    specials = LLAMA3_SPECIALS if llama3 else ["<|endoftext|>"]
    tok = Tokenizer(models.BPE(ignore_merges=llama3))
    if llama3:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer)
    if not llama3:
        return tok
    # LLaMA-3's vocabulary has tokens its merges never build (it came from tiktoken's ranks),
    # which is why it sets ignore_merges: a piece that is a token is that token. A trained
    # vocabulary has none, so add some whole words of the corpus the same way.
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for word in WHOLE_WORDS:
        key = "".join(BYTE_TO_UNICODE[b] for b in word.encode())
        if key not in vocab:
            vocab[key] = max(vocab.values()) + 1
    return Tokenizer.from_str(json.dumps(data))


def check_byte_level(pentad, path, name, docs, failures):
    tok = Tokenizer.from_file(str(path))  # what pentad reads
    with_specials = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
    tok.encode_special_tokens = True
    as_text = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
    compare(f"{name} --special", docs, pentad_encode(pentad, path, docs, True), with_specials,
            failures)
    got = pentad_encode(pentad, path, docs, False)
    compare(name, docs, got, as_text, failures)
    decoded = pentad_decode(pentad, path, got)
    round_trips = sum(d == doc for d, doc in zip(decoded, docs))
    print(f"{name}: {round_trips}/{len(docs)} documents decode back")
    if round_trips != len(docs):
        failures.append(f"{name}: {len(docs) - round_trips} documents do not decode back")
    return with_specials != as_text


def check_sentencepiece(pentad, work, name, docs, failures, **options):
    prefix = work / name
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([d.replace("\n", " ") for d in docs]), model_prefix=str(prefix),
        byte_fallback=True, character_coverage=0.98, minloglevel=2, **options)
    sp = spm.SentencePieceProcessor(model_file=f"{prefix}.model")
    path = Path(f"{prefix}.model")
    compare(name, docs, pentad_encode(pentad, path, docs, False), [sp.encode(d) for d in docs],
            failures)
    # --special: control symbols (<s>, </s>) written in the text are cut out first, each
    # stretch between them encoded by the library.
    controls = sorted((sp.id_to_piece(i) for i in range(sp.get_piece_size())
                       if sp.is_control(i)), key=len, reverse=True)

    def with_controls(text):
        ids, i, gap = [], 0, 0
        while i < len(text):
            hit = next((c for c in controls if text.startswith(c, i)), None)
            if hit is None:
                i += 1
                continue
            if i > gap:
                ids += sp.encode(text[gap:i])
            ids.append(sp.piece_to_id(hit))
            i = gap = i + len(hit)
        return ids + (sp.encode(text[gap:]) if gap < len(text) else [])

    got = pentad_encode(pentad, path, docs, True)
    compare(f"{name} --special", docs, got, [with_controls(d) for d in docs], failures)
    decoded = pentad_decode(pentad, path, got)
    want = [sp.decode(ids) for ids in got]
    same = sum(a == b for a, b in zip(decoded, want))
    print(f"{name}: {same}/{len(docs)} decodings equal the library's")
    if same != len(docs):
        failures.append(f"{name}: {len(docs) - same} decodings differ from the library's")
    fallback = sum(1 for ids in got for t in ids if sp.is_byte(t))
    print(f"{name}: {fallback} byte-fallback tokens")
    if fallback == 0:
        failures.append(f"{name}: byte fallback never used; the corpus does not test it")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    pentad, work = sys.argv[1], Path(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    docs = make_corpus(400, seed=7)
    failures = []

    train_byte_level(docs, llama3=False, vocab_size=700).save(str(work / "gpt2_bpe.json"))
    if not check_byte_level(pentad, work / "gpt2_bpe.json", "gpt2_bpe", docs, failures):
        failures.append("gpt2_bpe: no document has <|endoftext|> as a token; nothing tested")
    llama3 = train_byte_level(docs, llama3=True, vocab_size=700)
    llama3.save(str(work / "llama3_bpe.json"))
    check_byte_level(pentad, work / "llama3_bpe.json", "llama3_bpe", docs, failures)
    # pentad's own training writes a tokenizer.json that the library loads and agrees with.
    (work / "corpus.txt").write_text("\n".join(docs), encoding="utf-8")
    subprocess.run([pentad, "tokenizer", "train", work / "corpus.txt", "--vocab-size", "600",
                    "-o", work / "pentad_bpe.json"], check=True, stdout=subprocess.DEVNULL)
    check_byte_level(pentad, work / "pentad_bpe.json", "pentad_bpe", docs, failures)
    # ignore_merges must matter on this corpus, or the comparison would not test it.
    data = json.loads(llama3.to_str())
    data["model"]["ignore_merges"] = False
    plain = Tokenizer.from_str(json.dumps(data))
    plain.encode_special_tokens = llama3.encode_special_tokens = True
    differ = sum(a.ids != b.ids for a, b in zip(llama3.encode_batch(docs), plain.encode_batch(docs)))
    print(f"llama3_bpe: ignore_merges changes the ids of {differ} documents")
    if differ == 0:
        failures.append("llama3_bpe: ignore_merges changes no ids on this corpus")

    check_sentencepiece(pentad, work, "sp_bpe", docs, failures, model_type="bpe",
                        vocab_size=500, normalization_rule_name="identity", split_digits=True,
                        add_dummy_prefix=True, remove_extra_whitespaces=False,
                        allow_whitespace_only_pieces=True)
    check_sentencepiece(pentad, work, "sp_unigram", docs, failures, model_type="unigram",
                        vocab_size=500)
    if failures:
        sys.exit("FAILED:\n" + "\n".join(failures))
    print("tokenizer ids match")


if __name__ == "__main__":
    main()
