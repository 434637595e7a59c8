#!/usr/bin/env python3
"""The zero-shot tasks of `megatron eval` computed with Hugging Face transformers on the same
model, data and rule, to compare against ours example by example.

    lambada DIR GGUF FILE N        LAMBADA (olmo requests.jsonl.gz or Megatron JSONL), first N
                                   passages, strict and non-strict: per-example correctness,
                                   counts, seconds per example -> JSON on stdout
    ppl DIR GGUF TEXT SEQ STRIDE   sliding-window perplexity of a text file with Megatron's
                                   window rule (window SEQ+1, stride STRIDE, windows after the
                                   first score only their last STRIDE targets; no detokenizer)

The rule is SPEC §9.1-9.2: non-strict target = last token of tokenize(text); strict target =
tokenize(" " + last word), context = tokenize(text before it, stripped); correct iff the argmax
equals the target at every target position. Tokenization adds no special tokens.
"""
import gzip
import json
import math
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def passages(path, n):
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            v = json.loads(line)
            out.append(v["text"] if "text" in v else v["request"]["context"] + v["request"]["continuation"])
            if len(out) >= n:
                break
    return out


def encode(tok, text):
    return tok(text, add_special_tokens=False).input_ids


def split(tok, text, strict):
    if not strict:
        ids = encode(tok, text)
        return ids[:-1], ids[-1:]
    word = text.split()[-1]
    start = text.rfind(word)
    return encode(tok, text[:start].strip()), encode(tok, " " + word)


def lambada(model, tok, path, n):
    texts = passages(path, n)
    result = {}
    for strict in (False, True):
        correct = []
        t0 = time.time()
        for text in texts:
            ctx, tgt = split(tok, text, strict)
            ids = ctx + tgt
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0]
            pred = logits[len(ctx) - 1:len(ids) - 1].argmax(-1).tolist()
            correct.append(int(pred == tgt))
        secs = time.time() - t0
        key = "strict" if strict else "non_strict"
        result[key] = {"correct": correct, "number_correct": sum(correct), "total": len(texts),
                       "accuracy": sum(correct) / len(texts), "seconds_per_example": secs / len(texts)}
        print(key, sum(correct), "/", len(texts), "%.3f s/example" % (secs / len(texts)), file=sys.stderr)
    return result


def ppl(model, tok, path, seq, stride):
    text = open(path, encoding="utf-8").read()
    ids = encode(tok, text)
    n_words = len(text.strip().split(" "))
    targets = len(ids) - 1
    windows = max(math.ceil(max(targets - stride, 0) / stride) + 1, 1)
    total, scored = 0.0, 0
    t0 = time.time()
    for i in range(windows):
        w = ids[i * stride:i * stride + seq + 1]
        if len(w) < 2:
            continue
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([w[:-1]])).logits[0].double(), -1)
        nll = -logp[torch.arange(len(w) - 1), torch.tensor(w[1:])]
        keep = torch.ones(len(w) - 1)
        if stride != seq and i > 0:
            keep[:max(seq - stride, 0)] = 0
        total += float((nll * keep[:len(nll)]).sum())
        scored += int(keep.sum())
    val_loss = total / (len(ids) - 1)
    ratio = (len(ids) - 1) / (n_words - 1)
    return {"avg_loss": val_loss, "ppl": math.exp(min(20, val_loss)), "adjusted_ppl": math.exp(min(20, val_loss * ratio)),
            "token_ratio": ratio, "num_tokenized_tokens": len(ids), "windows": windows, "scored_targets": scored,
            "seconds": time.time() - t0}


def main():
    mode, model_dir, gguf = sys.argv[1], sys.argv[2], sys.argv[3]
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=gguf, torch_dtype=torch.float32)
    model.eval()
    if mode == "lambada":
        out = lambada(model, tok, sys.argv[4], int(sys.argv[5]))
    else:
        out = ppl(model, tok, sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
    out["transformers"] = __import__("transformers").__version__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
