#!/usr/bin/env bash
# Generation speed of SmolLM2-135M-Instruct: `megatron generate` (release, kv cache, greedy)
# at batch 1 and 8, then transformers on the same machine (scripts/smollm2_speed_hf.py).
# Both print ms per generated token (all rows' tokens; prefill included).
#   flock /work/heavy.lock bash scripts/smollm2_speed.sh     # N=tokens RUN=dir
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
M="${M:-$root/target/release/megatron}"
RUN="${RUN:-$root/target/smollm2_speed}"
PY="${PY:-/work/venv/bin/python}"
N="${N:-64}"
gguf="$(bash "$root/scripts/fetch_smollm2.sh" | tail -1)"
rm -rf "$RUN" && mkdir -p "$RUN"
"$M" import gguf --gguf "$gguf" --save "$RUN/ckpt" >/dev/null
for b in 1 8; do
  : > "$RUN/prompts$b.txt"
  for _ in $(seq "$b"); do echo "Once upon a time, in a small village," >> "$RUN/prompts$b.txt"; done
  echo "megatron batch $b:"
  "$M" generate --load "$RUN/ckpt" --prompts-file "$RUN/prompts$b.txt" --tokens-to-generate "$N" \
    --top-k 1 --threads 2 2>&1 >/dev/null | grep "ms/token"
done
"$PY" "$root/scripts/smollm2_speed_hf.py" "$(dirname "$gguf")" "$N"
