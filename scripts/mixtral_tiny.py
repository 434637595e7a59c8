#!/usr/bin/env python3
"""A tiny random MixtralForCausalLM for the Mixtral import parity test (tests/moe_mixtral.rs).

Usage: mixtral_tiny.py OUT_DIR
Writes OUT_DIR/{config.json, model.safetensors} (transformers' save_pretrained, fp32) and
OUT_DIR/reference.json: the input ids and transformers' logits for them (eager attention),
and `greedy`: the 5 tokens a greedy decode appends to the ids (full recompute, no cache).
"""
import json
import sys

import torch
from transformers import MixtralConfig, MixtralForCausalLM


def main(out):
    torch.manual_seed(1234)
    cfg = MixtralConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        initializer_range=0.2,
        attn_implementation="eager",
    )
    model = MixtralForCausalLM(cfg).eval()
    # Random (not the tiny init's near-zero) norms, so every weight matters.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name or name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=True)
    ids = torch.randint(0, cfg.vocab_size, (1, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits = model(ids).logits[0]
        seq = ids
        for _ in range(5):
            nxt = model(seq).logits[0, -1].argmax().view(1, 1)
            seq = torch.cat([seq, nxt], dim=1)
    greedy = seq[0, ids.shape[1]:].tolist()
    with open(f"{out}/reference.json", "w") as f:
        ref = {"ids": ids[0].tolist(), "logits": logits.flatten().tolist(), "vocab": cfg.vocab_size, "greedy": greedy}
        json.dump(ref, f)


if __name__ == "__main__":
    main(sys.argv[1])
