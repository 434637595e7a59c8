#!/usr/bin/env python3
"""Goldens for datasets/src/gpt/description.rs: the GPTDataset cache description (and its md5)
as Megatron-LM main builds it. Usage: export a Megatron-LM checkout to DIR (git archive HEAD megatron),
then `MEGATRON_LM=DIR /work/venv/bin/python scripts/megatron_cache_golden.py`. The tokenizer files are
not loaded (the description depends only on the class, the path and the keyword arguments)."""
import os
import sys, json, hashlib
from collections import OrderedDict
from types import SimpleNamespace
sys.path.insert(0, os.environ.get("MEGATRON_LM", "/tmp/conf_mlm"))
import megatron.core.tokenizers.text.text_tokenizer as tt
# The description depends only on the class, the path and the kwargs: skip loading the files.
tt.MegatronTokenizerText._restore_model = lambda self, **kw: SimpleNamespace(chat_template=None, vocab_size=50257, pad=None, eod=0, eos=0)
from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, GPTDataset
from megatron.core.datasets.utils import Split

def args(**kw):
    base = dict(tokenizer_type=None, special_tokens=None, vocab_file=None, merge_file=None,
                tokenizer_hf_no_use_fast=False, trust_remote_code=False,
                tokenizer_hf_no_include_special_tokens=False, use_gigatoken=False, vocab_size=None,
                metadata_path=None, pad_vocab_size=False, null_tokenizer_pad_id=-1, tokenizer_model=None)
    base.update(kw)
    return SimpleNamespace(**base)

cases = {
    "gpt2": args(tokenizer_type="GPT2BPETokenizer", vocab_file="gpt2-vocab.json", merge_file="gpt2-merges.txt"),
    "null": args(tokenizer_type="NullTokenizer", vocab_size=100),
    "bert_lower": args(tokenizer_type="BertWordPieceLowerCase", vocab_file="vocab.txt"),
    "bert_case": args(tokenizer_type="BertWordPieceCase", vocab_file="vocab.txt"),
    "bert_lower_nospecial": args(tokenizer_type="BertWordPieceLowerCase", vocab_file="vocab.txt", tokenizer_hf_no_include_special_tokens=True),
}
out = {}
for name, a in cases.items():
    tok = build_tokenizer(a)
    cfg = GPTDatasetConfig(blend=(["/t/D"], None), random_seed=1234, sequence_length=5, split="969, 30, 1", tokenizer=tok,
                           reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
    ui = OrderedDict()
    ui["class"] = "GPTDataset"
    ui["dataset_path"] = "/t/D"
    ui["num_samples"] = 30
    ui["index_split"] = Split.train.name
    for attr in GPTDataset._key_config_attributes():
        ui[attr] = getattr(cfg, attr)
    text = json.dumps(ui, indent=4, default=lambda obj: obj.unique_identifiers)
    out[name] = {"text": text, "md5": hashlib.md5(text.encode()).hexdigest()}
print(json.dumps(out, indent=1))
