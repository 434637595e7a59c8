"""Fixture of models/t5/tests/hf_t5.rs: a tiny random T5ForConditionalGeneration (T5 v1.1
style: relative positions, gated GeLU, RMS T5LayerNorm, no biases, tied head with its
d_model^-0.5 scaling) made with transformers, saved as safetensors with its config, and its
logits for one (input, decoder input) pair.

Usage: /work/venv/bin/python scripts/t5_hf_fixture.py models/t5/tests/fixtures/hf_t5_tiny
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import T5Config, T5ForConditionalGeneration

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)
cfg = T5Config(
    vocab_size=48, d_model=16, d_kv=8, d_ff=24, num_layers=2, num_decoder_layers=2, num_heads=2,
    relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
    layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu", tie_word_embeddings=True,
    decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
)
model = T5ForConditionalGeneration(cfg).eval()
with torch.no_grad():  # larger random weights than T5's init so every path matters
    for p in model.parameters():
        p.normal_(0.0, 0.5)
state = {k: v.contiguous() for k, v in model.state_dict().items() if k not in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")}
save_file(state, os.path.join(out, "model.safetensors"))
cfg.to_json_file(os.path.join(out, "config.json"))
enc = [[5, 17, 33, 2, 40, 11, 7, 29, 1]]
dec = [[0, 9, 44, 3, 21, 12]]
with torch.no_grad():
    logits = model(input_ids=torch.tensor(enc), decoder_input_ids=torch.tensor(dec)).logits
    gen = model.generate(torch.tensor(enc), max_new_tokens=8, do_sample=False, num_beams=1,
                         decoder_start_token_id=0, eos_token_id=1, pad_token_id=0)
json.dump({"input_ids": enc[0], "decoder_input_ids": dec[0], "logits": logits[0].tolist(),
           "greedy": gen[0].tolist()},
          open(os.path.join(out, "expected.json"), "w"))
print("saved", len(state), "tensors; logits", tuple(logits.shape))
