#!/usr/bin/env python3
"""A tiny random MixtralForCausalLM for the Mixtral import parity test (tests/moe_mixtral.rs).

Usage: mixtral_tiny.py OUT_DIR
Writes OUT_DIR/{config.json, model.safetensors} (transformers' save_pretrained, fp32) and
OUT_DIR/reference.json: the input ids and transformers' logits for them (eager attention).
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
    with open(f"{out}/reference.json", "w") as f:
        json.dump({"ids": ids[0].tolist(), "logits": logits.flatten().tolist(), "vocab": cfg.vocab_size}, f)


if __name__ == "__main__":
    main(sys.argv[1])
