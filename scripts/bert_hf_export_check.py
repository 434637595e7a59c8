"""Loads the tiny BertForPreTraining that `cargo run -p megatron-bert --example hf_export_check
-- DIR` exported with transformers and compares its MLM and sentence-order logits (at every
real token) with ours (DIR/ours.safetensors). Usage: python scripts/bert_hf_export_check.py DIR"""
import sys

import torch
from safetensors.torch import load_file
from transformers import BertForPreTraining

d = sys.argv[1]
ours = load_file(f"{d}/ours.safetensors")
model = BertForPreTraining.from_pretrained(d).eval()
ids = ours["input_ids"].long()
lengths = ours["lengths"].long()
mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
with torch.no_grad():
    out = model(input_ids=ids, token_type_ids=ours["token_type_ids"].long(), attention_mask=mask)
real = mask.bool()
mlm = (out.prediction_logits[real] - ours["prediction_logits"][real]).abs().max().item()
mlm_ref = out.prediction_logits[real].abs().max().item()
sop = (out.seq_relationship_logits - ours["seq_relationship_logits"]).abs().max().item()
sop_ref = out.seq_relationship_logits.abs().max().item()
print(f"MLM logits: max |diff| {mlm:.3e} (max |logit| {mlm_ref:.3f}); "
      f"NSP/SOP logits: max |diff| {sop:.3e} (max |logit| {sop_ref:.3f})")
assert mlm <= 1e-4 * max(mlm_ref, 1.0) and sop <= 1e-4 * max(sop_ref, 1.0), "logits differ"
print("OK: transformers' BertForPreTraining reproduces our logits")
