"""Fixture of datasets/tests/t5_dataset.rs: Megatron-Core's own T5MaskedWordPieceDataset
(megatron-core from pip, its compiled `helpers_cpp.build_mapping` and
`T5MaskedWordPieceDataset.__getitem__` / `_create_masked_lm_predictions`) run on a small
sentence-split tiny-Shakespeare prefix, so the Rust dataset can be compared with it.

Usage: /work/venv/bin/python scripts/t5_dataset_fixture.py ../shared/data datasets/tests/fixtures/t5

Data: the first 400 paragraphs (blank-line separated) of tinyshakespeare.txt, one sentence per
non-empty line, lower-cased BERT WordPiece ids (transformers' BertTokenizer on
bert-base-uncased/vocab.txt), `[CLS] sentence [SEP]` per sentence is NOT added (plain ids).
Vocabulary as Megatron's BertWordPieceLowerCase with --vocab-extra-ids 100: the 30522 ids of
vocab.txt, then [BOS] 30522, [EOS] 30523, <extra_id_0..99> 30524..30623.
Writes t5_shakespeare.{bin,idx} (uint16, Megatron's dtype for vocabularies < 65500) and
expected.json: config, the first 50 sample-index rows, md5 of the whole index, the first 100
samples in full, the md5 of the first 1000 and an 8-hex-digit md5 prefix of each.
"""
import hashlib
import json
import os
import sys
import types

import numpy
import torch
from transformers import BertTokenizer

from megatron.core.datasets import helpers_cpp
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
from megatron.core.datasets.t5_dataset import T5MaskedWordPieceDataset

shared, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
vocab_file = os.path.join(shared, "bert-base-uncased", "vocab.txt")
tok = BertTokenizer(vocab_file, do_lower_case=True)
vocab = [l.rstrip("\n") for l in open(vocab_file, encoding="utf-8")]
text = open(os.path.join(shared, "tinyshakespeare.txt"), encoding="utf-8").read()
paragraphs = [p for p in text.split("\n\n") if p.strip()][:400]

prefix = os.path.join(out, "t5_shakespeare")
b = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
for p in paragraphs:
    sents = [tok.convert_tokens_to_ids(tok.tokenize(line)) for line in p.split("\n") if line.strip()]
    sents = [s for s in sents if s]
    flat = [t for s in sents for t in s]
    b.add_document(torch.tensor(flat, dtype=torch.int64), [len(s) for s in sents])
b.finalize(prefix + ".idx")

ENC, DEC, SEED, NUM = 64, 24, 1234, 1000
data = IndexedDataset(prefix)
docs = data.document_indices  # all documents
sample_index = helpers_cpp.build_mapping(docs, data.sequence_lengths, 2**31 - 2, NUM, ENC - 2, 0.1, SEED, False, 1)

ids = {"cls": vocab.index("[CLS]"), "sep": vocab.index("[SEP]"), "mask": vocab.index("[MASK]"), "pad": vocab.index("[PAD]")}
inv_vocab = {i: v for i, v in enumerate(vocab)}
inv_vocab[30522], inv_vocab[30523] = "[BOS]", "[EOS]"
for i in range(100):
    inv_vocab[30524 + i] = f"<extra_id_{i}>"
tokenizer = types.SimpleNamespace(
    cls=ids["cls"], sep=ids["sep"], mask=ids["mask"], pad=ids["pad"], bos=30522, eos=30523,
    inv_vocab=inv_vocab, additional_special_tokens_ids=list(range(30524, 30624)),
)
config = types.SimpleNamespace(
    tokenizer=tokenizer, random_seed=SEED, sequence_length=ENC, sequence_length_encoder=ENC,
    sequence_length_decoder=DEC, masking_probability=0.15, short_sequence_probability=0.1,
    masking_max_ngram=10, masking_do_full_word=True, masking_do_permutation=False,
    masking_use_longer_ngrams=False, masking_use_geometric_distribution=True,
)
ds = object.__new__(T5MaskedWordPieceDataset)
ds.dataset, ds.config, ds.sample_index, ds._pad_token_id = data, config, sample_index, ids["pad"]

FIELDS = ["text_enc", "text_dec", "labels", "loss_mask", "enc_mask", "dec_mask"]
md5 = hashlib.md5()
samples, per_sample = [], []
for i in range(NUM):
    s = ds[i]
    one = hashlib.md5()
    for f in FIELDS:
        md5.update(numpy.asarray(s[f], dtype="<i8").tobytes())
        one.update(numpy.asarray(s[f], dtype="<i8").tobytes())
    md5.update(numpy.asarray([s["truncated"]], dtype="<i8").tobytes())
    one.update(numpy.asarray([s["truncated"]], dtype="<i8").tobytes())
    per_sample.append(one.hexdigest()[:8])
    if i < 100:
        samples.append({f: [int(x) for x in s[f]] for f in FIELDS} | {"truncated": int(s["truncated"])})
expected = {
    "encoder_seq_length": ENC, "decoder_seq_length": DEC, "seed": SEED, "num_samples": NUM,
    "special": ids | {"bos": 30522, "eos": 30523, "first_sentinel": 30524, "sentinels": 100},
    "index_len": int(sample_index.shape[0]),
    "index_head": sample_index[:50].tolist(),
    "index_md5": hashlib.md5(numpy.asarray(sample_index, dtype="<u8").tobytes()).hexdigest(),
    "samples_md5": md5.hexdigest(),
    "samples": samples,
    "sample_md5_prefixes": per_sample,
}
json.dump(expected, open(os.path.join(out, "expected.json"), "w"))
print("index rows", sample_index.shape[0], "dtype", sample_index.dtype, "md5", expected["samples_md5"])
