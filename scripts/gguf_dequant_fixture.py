#!/usr/bin/env python3
"""Writes plugins/gguf/tests/dequant_fixture.json: random blocks of every ggml type the
megatron-gguf reader supports and gguf-py's dequantization of them (the reference that
transformers uses when it loads a GGUF file).

    /work/venv/bin/python scripts/gguf_dequant_fixture.py
"""
import json
import os
import numpy as np
from gguf import GGMLQuantizationType as T, quants

rng = np.random.default_rng(1234)


def f16_bytes(n):
    # Finite, varied scales (random bits would include inf/nan).
    return rng.uniform(-2.0, 2.0, n).astype(np.float16).tobytes()


def block(ty):
    if ty == T.Q8_0:
        return f16_bytes(1) + rng.integers(0, 256, 32, dtype=np.uint8).tobytes()
    if ty == T.Q4_0:
        return f16_bytes(1) + rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
    if ty == T.Q4_1:
        return f16_bytes(2) + rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
    if ty == T.Q4_K:
        return f16_bytes(2) + rng.integers(0, 256, 12 + 128, dtype=np.uint8).tobytes()
    if ty == T.Q6_K:
        return rng.integers(0, 256, 128 + 64 + 16, dtype=np.uint8).tobytes() + f16_bytes(1)
    if ty == T.F16:
        return f16_bytes(1)
    if ty == T.BF16:
        return (rng.uniform(-3, 3, 1).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    if ty == T.F32:
        return rng.uniform(-3, 3, 1).astype(np.float32).tobytes()
    raise ValueError(ty)


cases = []
for ty, nblocks in [(T.F32, 8), (T.F16, 8), (T.BF16, 8), (T.Q8_0, 3), (T.Q4_0, 3), (T.Q4_1, 3), (T.Q4_K, 2), (T.Q6_K, 2)]:
    raw = b"".join(block(ty) for _ in range(nblocks))
    values = quants.dequantize(np.frombuffer(raw, dtype=np.uint8), ty).astype(np.float32).reshape(-1)
    cases.append({"type": int(ty), "name": ty.name, "raw_hex": raw.hex(),
                  "values_bits": [int(v) for v in values.view(np.uint32)]})

out = os.path.join(os.path.dirname(__file__), "..", "plugins", "gguf", "tests", "dequant_fixture.json")
with open(out, "w") as f:
    json.dump({"generator": "scripts/gguf_dequant_fixture.py (gguf-py quants.dequantize)", "cases": cases}, f)
print("wrote", out, [c["name"] for c in cases])
