"""A tiny random transformers Mamba2ForCausalLM and its reference outputs (issue 18).

Usage: python scripts/hf_mamba2_fixture.py OUT_DIR
Writes OUT_DIR/{config.json, model.safetensors, reference.json}: the model (saved by
save_pretrained), some token ids, the logits of its slow pure-PyTorch path (torch_forward, CPU,
fp32) and 8 greedily generated tokens. Read by models/hybrid/tests/hf_mamba2.rs.
"""
import json
import sys

import torch
from transformers import Mamba2Config, Mamba2ForCausalLM

out = sys.argv[1]
torch.manual_seed(0)
cfg = Mamba2Config(
    vocab_size=64, hidden_size=32, state_size=8, num_heads=4, head_dim=16, n_groups=2, expand=2,
    conv_kernel=4, num_hidden_layers=2, chunk_size=8, use_bias=False, use_conv_bias=True,
    layer_norm_epsilon=1e-5, tie_word_embeddings=True, residual_in_fp32=True,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)
model = Mamba2ForCausalLM(cfg).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        # Random, not the (mostly constant) init, so every parameter shows up in the logits.
        if name.endswith(("norm.weight", "norm_f.weight", ".D")):
            p.copy_(1.0 + 0.2 * torch.randn_like(p))
model.save_pretrained(out, safe_serialization=True)
tokens = [[5, 17, 33, 2, 9, 60, 41, 7, 12, 3, 30, 22, 50], [1, 8, 8, 19, 44, 6, 25, 38, 11, 61, 4, 27, 14]]
ids = torch.tensor(tokens)
with torch.no_grad():
    # The slow path: no cuda kernels on CPU, so Mamba2Mixer.torch_forward runs.
    logits = model(ids).logits.float()
    gen = model.generate(ids[:, :5], max_new_tokens=8, do_sample=False, use_cache=True)
json.dump(
    {"tokens": tokens, "logits": logits.reshape(-1).tolist(), "vocab": cfg.vocab_size,
     "prompt_len": 5, "generated": gen[:, 5:].tolist()},
    open(f"{out}/reference.json", "w"),
)
print("wrote", out)
