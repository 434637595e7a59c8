#!/usr/bin/env python3
"""Oracle for the BERT dataset (SPEC 2.11): runs Megatron-LM's OWN code (megatron-core's
compiled `helpers_cpp.build_mapping` and `BERTMaskedWordPieceDataset.__getitem__` /
`_create_masked_lm_predictions`, unmodified) on a sentence-split .bin/.idx and writes what it
builds, for comparison with `megatron_datasets::bert`.

  make-fixture DIR   writes a small synthetic vocabulary + sentence-split dataset (with
                     megatron-core's IndexedDatasetBuilder) and the oracle's samples for two
                     configurations into DIR (the fixture of datasets/tests/bert_dataset.rs)
  samples ...        the samples of any dataset (e.g. tiny Shakespeare), as JSON lines

Needs megatron-core (pip install megatron-core; tested with 0.16.1) and numpy.
Only the dataset object's plumbing (torch.distributed, the cache, the builder) is bypassed:
the sample index and every sample come from Megatron's functions.
"""
import argparse
import hashlib
import json
import os
import sys
import types
import warnings

warnings.filterwarnings("ignore")
import numpy

from megatron.core.datasets import helpers_cpp
from megatron.core.datasets.bert_dataset import BERTMaskedWordPieceDataset
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder


class VocabTokenizer:
    """The attributes of Megatron's BERT tokenizer the dataset reads."""

    def __init__(self, vocab_path):
        with open(vocab_path, encoding="utf-8") as f:
            tokens = [line.rstrip("\n") for line in f]
        self.inv_vocab = dict(enumerate(tokens))
        ids = {t: i for i, t in enumerate(tokens)}
        self.cls, self.sep, self.mask, self.pad = ids["[CLS]"], ids["[SEP]"], ids["[MASK]"], ids["[PAD]"]


def megatron_dataset(prefix, vocab, seq, seed, num_samples, mask_prob, short_seq_prob, binary_head, docs=None):
    data = IndexedDataset(prefix)
    tok = VocabTokenizer(vocab)
    ndocs = data.document_indices.shape[0] - 1
    first, end = docs if docs else (0, ndocs)
    indices = numpy.arange(first, end)
    # As MaskedWordPieceDataset._build_sample_index does (num_samples set => many epochs).
    indices = numpy.append(indices, indices[-1] + 1)
    sample_index = helpers_cpp.build_mapping(
        data.document_indices[indices],
        data.sequence_lengths,
        numpy.iinfo(numpy.int32).max - 1,
        num_samples,
        seq - 3,
        short_seq_prob,
        seed,
        False,
        2 if binary_head else 1,
    )
    ds = object.__new__(BERTMaskedWordPieceDataset)
    ds.dataset = data
    ds.sample_index = sample_index
    ds.config = types.SimpleNamespace(
        tokenizer=tok,
        random_seed=seed,
        sequence_length=seq,
        masking_probability=mask_prob,
        short_sequence_probability=short_seq_prob,
        masking_max_ngram=3,
        masking_do_full_word=True,
        masking_do_permutation=False,
        masking_use_longer_ngrams=False,
        masking_use_geometric_distribution=False,
        classification_head=binary_head,
    )
    ds.token_lookup = sorted(tok.inv_vocab.keys())
    ds._pad_token_id = tok.pad
    return ds


def canonical(s):
    """The string whose md5 the Rust test compares."""
    parts = [",".join(str(int(v)) for v in s[k]) for k in ("text", "types", "labels", "padding_mask", "loss_mask")]
    return "|".join(parts + [str(int(s["is_random"])), str(int(s["truncated"]))])


def sample_json(s):
    return {k: (v.tolist() if hasattr(v, "tolist") else int(v)) for k, v in s.items()}


def make_fixture(out):
    os.makedirs(out, exist_ok=True)
    rng = numpy.random.RandomState(0)
    vocab = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += [f"w{i}" for i in range(150)] + [f"##s{i}" for i in range(60)]
    with open(os.path.join(out, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    first_word, first_sub = 6, 156
    prefix = os.path.join(out, "synthetic_sentences")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    for d in range(120):
        n_sent = 1 + rng.randint(0, 7)
        doc, lengths = [], []
        for s in range(n_sent):
            words = 2 + rng.randint(0, 14)
            if d == 17 and s == 1:
                words = 400  # > 512 pieces: the whole document is skipped
            sent = []
            for _ in range(words):
                sent.append(first_word + rng.randint(0, 150))
                for _ in range(rng.choice([0, 0, 0, 1, 2])):
                    sent.append(first_sub + rng.randint(0, 60))
            doc += sent
            lengths.append(len(sent))
        builder.add_document(numpy.array(doc, dtype=numpy.int64), lengths)
    builder.finalize(prefix + ".idx")
    cases = []
    for name, seq, seed, n, binary in [("binary_head", 64, 1234, 300, True), ("no_binary_head", 48, 7, 200, False)]:
        ds = megatron_dataset(prefix, os.path.join(out, "vocab.txt"), seq, seed, n, 0.15, 0.1, binary, docs=(0, 110))
        samples = [ds[i] for i in range(len(ds))]
        cases.append({
            "name": name, "seq_length": seq, "seed": seed, "num_samples": n, "binary_head": binary,
            "docs": [0, 110], "mask_prob": 0.15, "short_seq_prob": 0.1,
            "sample_index": numpy.asarray(ds.sample_index).tolist(),
            "md5": [hashlib.md5(canonical(s).encode()).hexdigest() for s in samples],
            "first": [sample_json(s) for s in samples[:3]],
        })
    with open(os.path.join(out, "oracle.json"), "w") as f:
        json.dump({"made_by": "scripts/bert_dataset_oracle.py make-fixture (megatron-core %s)" % megatron_version(),
                   "cases": cases}, f, separators=(",", ":"))


def megatron_version():
    try:
        from importlib.metadata import version
        return version("megatron-core")
    except Exception:
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mf = sub.add_parser("make-fixture")
    mf.add_argument("dir")
    sp = sub.add_parser("samples")
    sp.add_argument("--prefix", required=True)
    sp.add_argument("--vocab", required=True)
    sp.add_argument("--seq-length", type=int, default=128)
    sp.add_argument("--seed", type=int, default=1234)
    sp.add_argument("--num-samples", type=int, required=True)
    sp.add_argument("--count", type=int, default=1000, help="samples to write (the first COUNT)")
    sp.add_argument("--mask-prob", type=float, default=0.15)
    sp.add_argument("--short-seq-prob", type=float, default=0.1)
    sp.add_argument("--bert-no-binary-head", action="store_true")
    sp.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.cmd == "make-fixture":
        make_fixture(a.dir)
        return
    ds = megatron_dataset(a.prefix, a.vocab, a.seq_length, a.seed, a.num_samples, a.mask_prob,
                          a.short_seq_prob, not a.bert_no_binary_head)
    with open(a.out, "w") as f:
        for i in range(min(a.count, len(ds))):
            f.write(json.dumps(sample_json(ds[i])) + "\n")
    print(f"{len(ds)} samples in the index; wrote {min(a.count, len(ds))} to {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
