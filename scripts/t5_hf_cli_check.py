"""Oracle of tests/t5_hf_cli.rs (megatron import hf / export hf / generate for T5).

  make DIR [v11]  a tiny random T5ForConditionalGeneration saved with save_pretrained into DIR
                  (T5 v1.0 style: ReLU, tied head scaled by d_model^-0.5; with `v11` T5 v1.1
                  style: gated GeLU and tie_word_embeddings=False, which transformers 5.x turns
                  into `scale_decoder_outputs: false` with the head still tied), and DIR/expected.json with its logits for one (input, decoder input)
                  pair and its greedy generation.
  check ORIG OUT  loads OUT (written by `megatron export hf`) with transformers: every tensor
                  equals ORIG's bit for bit and the logits are identical.

Run with /work/venv/bin/python (torch, transformers, safetensors).
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import T5Config, T5ForConditionalGeneration

ENC = [[7, 3, 19, 25, 4, 30, 12, 1]]
DEC = [[0, 14, 2, 27, 9]]


def logits_of(model):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ENC), decoder_input_ids=torch.tensor(DEC)).logits[0]


def make(out, variant="v10"):
    v11 = variant == "v11"
    torch.manual_seed(2 if v11 else 1)
    cfg = T5Config(
        vocab_size=40, d_model=24, d_kv=6, d_ff=32, num_layers=3, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
        layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu" if v11 else "relu", tie_word_embeddings=not v11,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )
    model = T5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # larger than T5's init so that every path matters
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    model.save_pretrained(out, safe_serialization=True)
    gen = model.generate(torch.tensor(ENC), max_new_tokens=10, do_sample=False, num_beams=1,
                         decoder_start_token_id=0, eos_token_id=1, pad_token_id=0)
    json.dump({"input_ids": ENC[0], "decoder_input_ids": DEC[0], "logits": logits_of(model).tolist(),
               "greedy": gen[0].tolist()}, open(os.path.join(out, "expected.json"), "w"))
    print("made", out)


def check(orig, out):
    a, b = load_file(os.path.join(orig, "model.safetensors")), load_file(os.path.join(out, "model.safetensors"))
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].view(torch.int32), b[k].view(torch.int32)), f"{k} differs"
    m1 = T5ForConditionalGeneration.from_pretrained(orig).eval()
    m2 = T5ForConditionalGeneration.from_pretrained(out).eval()
    l1, l2 = logits_of(m1), logits_of(m2)
    assert torch.equal(l1, l2), (l1 - l2).abs().max()
    print(f"export ok: {len(a)} tensors bit-identical, transformers logits identical (max |logit| {l1.abs().max():.3f})")


if __name__ == "__main__":
    {"make": lambda: make(*sys.argv[2:4]), "check": lambda: check(sys.argv[2], sys.argv[3])}[sys.argv[1]]()
