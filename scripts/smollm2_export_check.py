#!/usr/bin/env python3
"""Loads a `megatron export hf` directory of SmolLM2-135M-Instruct in transformers and compares
its logits with transformers' own load of the original GGUF (the reference): last-position
logits of a few prompts (max |export - gguf| / max |gguf|) and 32 greedy tokens.

    /work/venv/bin/python scripts/smollm2_export_check.py EXPORT_DIR GGUF_DIR
"""
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "<|im_start|>user\nWhat is the tallest mountain in the world?<|im_end|>\n<|im_start|>assistant\n",
]


def main():
    export_dir, gguf_dir = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    ref = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF, torch_dtype=torch.float32).eval()
    ours = AutoModelForCausalLM.from_pretrained(export_dir, torch_dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(export_dir)
    print(f"export: {type(ours).__name__}, {sum(p.numel() for p in ours.parameters())} parameters")
    worst = 0.0
    for text in PROMPTS:
        ids = tok(text, return_tensors="pt").input_ids
        with torch.no_grad():
            a = ref(ids).logits[0, -1].double()
            b = ours(ids).logits[0, -1].double()
        rel = ((a - b).abs().max() / a.abs().max()).item()
        worst = max(worst, rel)
        ga = ref.generate(ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1]:].tolist()
        gb = ours.generate(ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1]:].tolist()
        print(f"{text!r}: max |export - gguf| / max |gguf| = {rel:.3e}; greedy 32 tokens identical: {ga == gb}")
        assert ga == gb, (ga, gb)
    print(f"worst relative logit difference {worst:.3e}")
    assert worst < 1e-5, worst


if __name__ == "__main__":
    main()
