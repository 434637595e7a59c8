#!/usr/bin/env python3
"""transformers' greedy generation speed of SmolLM2-135M-Instruct (from the GGUF, fp32, eager
attention, 2 torch threads): ms per generated token at batch 1 and 8 (N new tokens per row,
prompt prefill included, as `megatron generate` reports it).

    /work/venv/bin/python scripts/smollm2_speed_hf.py GGUF_DIR [N]
"""
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "Once upon a time, in a small village,"  # runs the full N tokens in both (no early end of text)


def main():
    gguf_dir = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF, torch_dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    for batch in (1, 8):
        x = ids.repeat(batch, 1)
        with torch.no_grad():
            model.generate(x, max_new_tokens=4, do_sample=False, min_new_tokens=4)  # warm-up
            t0 = time.perf_counter()
            out = model.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False)
            secs = time.perf_counter() - t0
        count = (out.shape[1] - x.shape[1]) * batch
        print(f"transformers batch {batch}: {count} tokens in {secs:.2f}s = {1e3 * secs / count:.1f} ms/token "
              f"({1e3 * secs / (count / batch):.1f} ms/step)")


if __name__ == "__main__":
    main()
