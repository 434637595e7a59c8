#!/usr/bin/env python3
"""Fixtures for rope scaling and q/k layernorms, from Hugging Face transformers:

- core/tests/fixtures/rope_scaling_inv_freq.json: the rotary inverse frequencies transformers
  computes for llama3 and linear scaling (several bases/factors/head sizes), read by
  core/tests/rope_scaling.rs;
- tests/fixtures/hf_llama3_scaled/: a tiny random LlamaForCausalLM with llama3 rope scaling
  (small original context so all three frequency bands occur), GQA and an untied head;
- tests/fixtures/hf_qwen3_qknorm/: a tiny random Qwen3ForCausalLM (per-head q/k RMSNorms,
  our --qk-layernorm, with linear rope scaling), tied head;
each with config.json, model.safetensors and reference.json (input ids and logits of a few
positions), read by tests/llama_variants.rs.

    /work/venv/bin/python scripts/llama_variants_fixture.py
"""
import json
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def inv_freq_cases():
    cases = []
    for theta, head_dim, rope in [
        (500000.0, 128, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        (500000.0, 64, {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        (100.0, 8, {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
        (10000.0, 64, {"rope_type": "linear", "factor": 4.0}),
        (10000.0, 64, {"rope_type": "default"}),
    ]:
        params = dict(rope, rope_theta=theta)
        cfg = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
                          max_position_embeddings=131072, rope_parameters=params)
        if rope["rope_type"] == "default":
            inv, scale = default_inv_freq(theta, head_dim)
        else:
            inv, scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](cfg, "cpu")
        assert float(scale) == 1.0
        cases.append({"rope_theta": theta, "head_dim": head_dim, "rope_scaling": rope,
                      "inv_freq": [float(x) for x in inv.to(torch.float32)]})
    return cases


def default_inv_freq(theta, dim):
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    return inv, 1.0


def save_model(model, cfg, out, seq=40):
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    # Keep only what the importer and the test read.
    for f in os.listdir(out):
        if f not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(out, f))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (1, seq), generator=g)
    with torch.no_grad():
        logits = model(ids).logits[0].to(torch.float64)
    positions = [0, 9, 31, seq - 1]
    ref = {"input_ids": ids[0].tolist(), "positions": positions,
           "logits": [[float(x) for x in logits[p]] for p in positions]}
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f)


def main():
    torch.manual_seed(0)
    cases = inv_freq_cases()
    core_fix = os.path.join(ROOT, "core", "tests", "fixtures")
    os.makedirs(core_fix, exist_ok=True)
    with open(os.path.join(core_fix, "rope_scaling_inv_freq.json"), "w") as f:
        json.dump(cases, f)

    common = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                  max_position_embeddings=128, initializer_range=0.2, attn_implementation="eager")
    llama_cfg = LlamaConfig(**common, tie_word_embeddings=False, rope_parameters={
        "rope_type": "llama3", "rope_theta": 100.0, "factor": 4.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    llama = LlamaForCausalLM(llama_cfg).eval()
    save_model(llama, llama_cfg, os.path.join(ROOT, "tests", "fixtures", "hf_llama3_scaled"))

    qwen_cfg = Qwen3Config(**common, tie_word_embeddings=True, rope_parameters={
        "rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0})
    qwen = Qwen3ForCausalLM(qwen_cfg).eval()
    with torch.no_grad():
        # Non-trivial q/k norm weights (they are initialized to ones).
        for layer in qwen.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    save_model(qwen, qwen_cfg, os.path.join(ROOT, "tests", "fixtures", "hf_qwen3_qknorm"))
    print("wrote", core_fix, "and tests/fixtures/hf_llama3_scaled, hf_qwen3_qknorm")


if __name__ == "__main__":
    sys.exit(main())
