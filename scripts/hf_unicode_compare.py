#!/usr/bin/env python3
"""Random-Unicode corpus + Hugging Face `tokenizers` ids, for comparing our BERT WordPiece and
GPT-2 tokenizers with HF on rare code points (issue 10).

    /work/venv/bin/python scripts/hf_unicode_compare.py --data ../shared/data --out /tmp/hfu --docs 20000
    HF_UNICODE_DIR=/tmp/hfu cargo test -p megatron-tokenizers --test hf_unicode -- --ignored --nocapture

Writes OUT/corpus.jsonl ({"text"}), OUT/bert_uncased.jsonl and OUT/gpt2.jsonl ({"doc", "ids"},
no special tokens). Documents mix: code points drawn from every plane that has assigned
characters (0, 1, 2, 3, 14; and the private-use planes 15, 16), mostly assigned ones (by this
Python's unicodedata) and some unassigned; combining marks; CJK; emoji; rare punctuation
blocks; ASCII words and spaces. Seeded: the same arguments give the same corpus.
"""
import argparse
import json
import os
import random
import unicodedata

os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers  # noqa: E402

PLANES = [0, 1, 2, 3, 14, 15, 16]
BLOCKS = [
    (0x0300, 0x036F), (0x1AB0, 0x1AFF), (0x1DC0, 0x1DFF), (0x20D0, 0x20FF), (0xFE20, 0xFE2F),  # combining
    (0x2E00, 0x2E7F), (0x2000, 0x206F), (0x3000, 0x303F), (0xFF00, 0xFFEF),  # punctuation, fullwidth
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF),  # CJK
    (0x30000, 0x3134F), (0x31350, 0x323AF),  # CJK ext G, H (plane 3)
    (0x1F300, 0x1FAFF), (0x2600, 0x27BF),  # emoji, symbols
    (0x0590, 0x08FF), (0x0900, 0x0DFF), (0x1780, 0x17FF), (0xA980, 0xABFF), (0x11000, 0x11FFF),  # scripts
    (0x1E000, 0x1EFFF), (0x16A40, 0x16FFF), (0xE0000, 0xE01EF),  # newer scripts, tags/VS
    (0x00C0, 0x024F), (0x1E00, 0x1EFF), (0x0370, 0x04FF),  # accented Latin, Greek, Cyrillic
]
WORDS = ["the", "Hello", "world", "naïve", "café", "ÅNGSTRÖM", "don't", "x1", "über", "test"]


def random_char(rng):
    r = rng.random()
    if r < 0.45:
        lo, hi = rng.choice(BLOCKS)
        return chr(rng.randint(lo, hi))
    if r < 0.85:
        plane = rng.choice(PLANES)
        for _ in range(20):
            cp = plane * 0x10000 + rng.randint(0, 0xFFFF)
            if 0xD800 <= cp <= 0xDFFF:
                continue
            if unicodedata.category(chr(cp)) != "Cn" or rng.random() < 0.1:
                return chr(cp)
        return chr(cp) if not (0xD800 <= cp <= 0xDFFF) else "a"
    return chr(rng.randint(0x20, 0x7E))


def random_doc(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        k = rng.random()
        if k < 0.3:
            parts.append(rng.choice(WORDS))
        elif k < 0.4:
            parts.append(rng.choice([" ", "  ", "\t", "\n", "\u3000", "\u00a0"]))
        else:
            parts.append("".join(random_char(rng) for _ in range(rng.randint(1, 8))))
        parts.append(" " if rng.random() < 0.6 else "")
    return "".join(parts)


def bert(data):
    wp = models.WordPiece.from_file(os.path.join(data, "bert-base-uncased/vocab.txt"), unk_token="[UNK]",
                                    max_input_chars_per_word=100)
    tok = Tokenizer(wp)
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tok


def gpt2(data):
    tok = Tokenizer(models.BPE.from_file(os.path.join(data, "gpt2/vocab.json"), os.path.join(data, "gpt2/merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=10)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    docs = [random_doc(rng) for _ in range(args.docs)]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    for name, build in (("bert_uncased", bert), ("gpt2", gpt2)):
        tok = build(args.data)
        with open(os.path.join(args.out, name + ".jsonl"), "w") as f:
            for i, e in enumerate(tok.encode_batch(docs, add_special_tokens=False)):
                f.write(json.dumps({"doc": i, "ids": e.ids}) + "\n")
    import tokenizers
    print(f"wrote {len(docs)} documents and HF tokenizers {tokenizers.__version__} ids to {args.out} "
          f"(python unicodedata {unicodedata.unidata_version})")


if __name__ == "__main__":
    main()
