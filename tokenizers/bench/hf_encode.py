#!/usr/bin/env python3
"""Hugging Face `tokenizers` encode throughput on the same input as `cargo bench -p
megatron-tokenizers --bench encode`: tinyshakespeare.txt split into paragraphs (at blank lines),
repeated to ~10 MB, encoded with `encode_batch` on ONE thread (set TOKENIZERS_PARALLELISM=false
and RAYON_NUM_THREADS=1, done below before the import). Prints MB/s per tokenizer.

The tokenizers are built from the raw vocab files exactly like shared/tools/ref_tokenize.py
(GPT-2: BPE + ByteLevel pre-tokenizer without prefix space; BERT: WordPiece + BertNormalizer +
BertPreTokenizer, no [CLS]/[SEP]).

Usage: python3 tokenizers/bench/hf_encode.py [--data ../shared/data] [--mb 10] [--per-doc]
  --per-doc  call `encode` once per paragraph instead of one `encode_batch` (slower: Python
             call overhead per document).
"""
import argparse
import os
import re
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: E402


def docs_of(path, mb):
    text = open(path, encoding="utf-8").read()
    # Paragraphs like shared/data/tinyshakespeare.jsonl (SOURCES.md).
    paras = [p.strip("\n") for p in re.split(r"\n\s*\n", text) if p.strip()]
    docs, size = [], 0
    while size < mb * 1_000_000:
        for p in paras:
            docs.append(p)
            size += len(p.encode("utf-8"))
    return docs, size


def gpt2(data):
    tok = Tokenizer(models.BPE.from_file(os.path.join(data, "gpt2/vocab.json"), os.path.join(data, "gpt2/merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def bert(data):
    wp = models.WordPiece.from_file(os.path.join(data, "bert-base-uncased/vocab.txt"), unk_token="[UNK]",
                                    max_input_chars_per_word=100)
    tok = Tokenizer(wp)
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tok


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.normpath(os.path.join(here, "../../../shared/data")))
    ap.add_argument("--mb", type=float, default=10.0)
    ap.add_argument("--per-doc", action="store_true")
    args = ap.parse_args()
    docs, size = docs_of(os.path.join(args.data, "tinyshakespeare.txt"), args.mb)
    for name, build in (("gpt2", gpt2), ("bert-uncased", bert)):
        tok = build(args.data)
        t0 = time.perf_counter()
        if args.per_doc:
            n = sum(len(tok.encode(d, add_special_tokens=False).ids) for d in docs)
        else:
            n = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))
        dt = time.perf_counter() - t0
        mode = "encode per doc" if args.per_doc else "encode_batch"
        print(f"hf-tokenizers {name:<13} {mode}: {size / dt / 1e6:7.2f} MB/s ({size} bytes, {len(docs)} docs, "
              f"{n} ids, {dt:.2f} s)")


if __name__ == "__main__":
    main()
