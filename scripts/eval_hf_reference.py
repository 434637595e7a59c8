#!/usr/bin/env python3
"""The zero-shot tasks of `megatron eval` computed with Hugging Face transformers on the same
model, data and rule, to compare against ours example by example.

    lambada DIR GGUF FILE N        LAMBADA (olmo requests.jsonl.gz or Megatron JSONL), first N
                                   passages, strict and non-strict: per-example correctness,
                                   counts, seconds per example -> JSON on stdout
    lambada-chunks DIR GGUF CHUNKDIR LOCK
                                   the same for every CHUNKDIR/cNNN.jsonl without a
                                   CHUNKDIR/../hf_NNN.json yet (written atomically), holding the
                                   file lock LOCK during each chunk and loading the model once
                                   (scripts/lambada_full_chunks.sh)
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
import os
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
    """Both rules over the first n passages. One forward serves both rules when the strict
    split tokenizes to the same ids as the whole passage (the usual case); only the logits of
    the positions that predict targets are computed (`logits_to_keep`)."""
    texts = passages(path, n)
    correct = {False: [], True: []}
    forwards = 0
    t0 = time.time()
    for text in texts:
        splits = {strict: split(tok, text, strict) for strict in (False, True)}
        # Rows each distinct id sequence needs: the longest target among the rules sharing it.
        keep = {}
        for ctx, tgt in splits.values():
            ids = tuple(ctx + tgt)
            keep[ids] = max(keep.get(ids, 0), len(tgt) + 1)
        cache = {}
        for ids, k in keep.items():
            with torch.no_grad():
                cache[ids] = model(torch.tensor([list(ids)]), logits_to_keep=k).logits[0]
            forwards += 1
        for strict in (False, True):
            ctx, tgt = splits[strict]
            logits = cache[tuple(ctx + tgt)]
            # logits[i] predicts token len(ids) - keep + 1 + i; the last row predicts nothing.
            pred = logits[-len(tgt) - 1:-1].argmax(-1).tolist()
            correct[strict].append(int(pred == tgt))
    secs = time.time() - t0
    result = {"forwards": forwards, "seconds": secs, "seconds_per_example_both_rules": secs / len(texts)}
    for strict in (False, True):
        c = correct[strict]
        key = "strict" if strict else "non_strict"
        result[key] = {"correct": c, "number_correct": sum(c), "total": len(texts), "accuracy": sum(c) / len(texts),
                       # The shared forwards make the rules' times inseparable: half of both each.
                       "seconds_per_example": secs / len(texts) / 2}
        print(key, sum(c), "/", len(texts), file=sys.stderr)
    print("%d forwards, %.3f s/example (both rules)" % (forwards, secs / len(texts)), file=sys.stderr)
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


def lambada_chunks(model, tok, chunk_dir, lock):
    import fcntl
    import glob
    version = __import__("transformers").__version__
    for f in sorted(glob.glob(os.path.join(chunk_dir, "c*.jsonl"))):
        c = os.path.basename(f)[1:-len(".jsonl")]
        out = os.path.join(os.path.dirname(chunk_dir.rstrip("/")), "hf_%s.json" % c)
        if os.path.exists(out):
            continue
        with open(lock, "a") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            result = lambada(model, tok, f, 1 << 30)
        result["transformers"] = version
        with open(out + ".tmp", "w") as o:
            json.dump(result, o)
            o.flush()
            os.fsync(o.fileno())
        os.rename(out + ".tmp", out)
        print(time.strftime("%H:%M:%S"), "hf chunk", c, "done", file=sys.stderr, flush=True)


def main():
    mode, model_dir, gguf = sys.argv[1], sys.argv[2], sys.argv[3]
    # One thread by default: on a loaded shared machine OpenMP spin-waiting of 2 threads cost
    # ~5x the CPU time of one (HF_THREADS overrides).
    torch.set_num_threads(int(os.environ.get("HF_THREADS", "1")))
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=gguf, torch_dtype=torch.float32)
    model.eval()
    if mode == "lambada-chunks":
        return lambada_chunks(model, tok, sys.argv[4], sys.argv[5])
    if mode == "lambada":
        out = lambada(model, tok, sys.argv[4], int(sys.argv[5]))
    else:
        out = ppl(model, tok, sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
    out["transformers"] = __import__("transformers").__version__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
