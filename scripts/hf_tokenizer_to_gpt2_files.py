#!/usr/bin/env python3
"""Writes vocab.json + merges.txt (GPT2BPETokenizer files) from a byte-level BPE
tokenizer.json (e.g. the one `megatron import gguf` writes for SmolLM2), so a build without the
`huggingface` feature can tokenize for that model.

    python3 scripts/hf_tokenizer_to_gpt2_files.py CKPT/tokenizer/tokenizer.json OUT_DIR

Only valid for tokenizers whose pre-tokenizer is plain ByteLevel with GPT-2's regex (checked);
added special tokens are written into vocab.json at their ids.
"""
import json
import os
import sys

src, out = sys.argv[1], sys.argv[2]
t = json.load(open(src, encoding="utf-8"))
pre = t.get("pre_tokenizer") or {}
if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) or t["model"]["type"] != "BPE":
    sys.exit(f"{src}: not a plain byte-level BPE tokenizer (pre_tokenizer {pre.get('type')}); use the huggingface feature")
vocab = dict(t["model"]["vocab"])
for a in t.get("added_tokens", []):
    vocab[a["content"]] = a["id"]
# GPT-2's byte-to-unicode table: a GPT2BPETokenizer needs every byte's token. Byte-level BPE
# vocabularies may lack a few control bytes (SmolLM2); they get ids above the vocabulary, which
# no text without those bytes produces and which the model refuses if one ever appears.
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
next_id = max(vocab.values()) + 1
missing = [chr(c) for c in cs if chr(c) not in vocab]
for ch in missing:
    vocab[ch] = next_id
    next_id += 1
if missing:
    print(f"added {len(missing)} missing byte tokens at ids >= {next_id - len(missing)}", file=sys.stderr)
merges = [m if isinstance(m, str) else " ".join(m) for m in t["model"]["merges"]]
os.makedirs(out, exist_ok=True)
json.dump(vocab, open(os.path.join(out, "vocab.json"), "w", encoding="utf-8"), ensure_ascii=False)
with open(os.path.join(out, "merges.txt"), "w", encoding="utf-8") as f:
    f.write("#version: 0.2\n")
    f.write("\n".join(merges) + "\n")
print(out, len(vocab), "tokens", len(merges), "merges")
