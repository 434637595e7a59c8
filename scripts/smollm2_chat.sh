#!/usr/bin/env bash
# Issue 14's chat item: SmolLM2-135M-Instruct imported from its GGUF answers a question through
# `megatron generate --chat` (the chat template comes from the GGUF metadata, carried into the
# checkpoint's tokenizer_config.json by `import gguf`), greedy, next to transformers'
# `apply_chat_template` + `generate` on the same GGUF. Needs the `huggingface` feature binary.
#   bash scripts/smollm2_chat.sh ["QUESTION"]        # M=binary RUN=dir TOKENS=n PY=python
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
M="${M:-$root/target/release/megatron}"
RUN="${RUN:-$root/target/smollm2_chat}"
PY="${PY:-/work/venv/bin/python}"
TOKENS="${TOKENS:-40}"
Q="${1:-Give me one tip for writing clear code.}"
gguf="$(bash "$root/scripts/fetch_smollm2.sh" | tail -1)"
[ -d "$RUN/ckpt" ] || "$M" import gguf --gguf "$gguf" --save "$RUN/ckpt" >/dev/null
"$M" generate --load "$RUN/ckpt" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$RUN/ckpt/tokenizer" \
  --chat --prompt "$Q" --top-k 1 --tokens-to-generate "$TOKENS"
"$PY" "$root/scripts/smollm2_chat_hf.py" "$(dirname "$gguf")" "$Q" "$TOKENS" 2>/dev/null
