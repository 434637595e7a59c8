"""Prints transformers' T5 relative-position buckets as the fixture of
models/t5/src/relative.rs (test `matches_transformers_fixture`).

Usage: /work/venv/bin/python scripts/t5_relative_buckets.py > models/t5/tests/fixtures/relative_buckets.json
Each case: (bidirectional, num_buckets, max_distance) and the buckets of relative positions
-300..=300 (memory position minus query position), from T5Attention._relative_position_bucket.
"""
import json

import torch
import transformers
from transformers.models.t5.modeling_t5 import T5Attention

rel = torch.arange(-300, 301)
cases = []
for bidirectional, nb, md in [(True, 32, 128), (False, 32, 128), (True, 8, 20), (False, 16, 50), (True, 64, 256)]:
    b = T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=nb, max_distance=md)
    cases.append({"bidirectional": bidirectional, "num_buckets": nb, "max_distance": md, "buckets": b.tolist()})
print(json.dumps({"transformers": transformers.__version__, "relative_from": -300, "cases": cases}))
