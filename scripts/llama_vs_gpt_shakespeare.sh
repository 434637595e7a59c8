#!/usr/bin/env bash
# A Llama-style GPT trained from scratch on tiny Shakespeare (4 layers, hidden 256, RoPE,
# GQA 4 heads / 2 groups, RMSNorm, SwiGLU with ffn 704 ~ 2/3 x 1024, no biases) next to the
# GPT-2 style model of the same size (learned positions, LayerNorm, GeLU ffn 1024, biases),
# same data, seed, batch and schedule. Prints both runs' lm loss at the log intervals and the
# final validation loss.
#   flock /work/heavy.lock bash scripts/llama_vs_gpt_shakespeare.sh     # ITERS=n RUN=dir
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
M="${M:-$root/target/release/megatron}"
RUN="${RUN:-$root/target/llama_vs_gpt}"
SHARED="${SHARED:-$root/../shared}"
ITERS="${ITERS:-200}"
mkdir -p "$RUN"
COMMON="--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128
  --micro-batch-size 8 --global-batch-size 8 --train-iters $ITERS --lr 1e-3 --min-lr 1e-4
  --lr-decay-style cosine --lr-warmup-iters 20 --weight-decay 0.1 --clip-grad 1.0 --seed 1234
  --log-interval 20 --eval-interval $ITERS --eval-iters 10 --hidden-dropout 0 --attention-dropout 0
  --data-path $SHARED/data/tinyshakespeare_gpt2_text_document --split 95,5,0
  --tokenizer-type GPT2BPETokenizer --vocab-file $SHARED/data/gpt2/vocab.json
  --merge-file $SHARED/data/gpt2/merges.txt"
LLAMA="--position-embedding-type rope --group-query-attention --num-query-groups 2
  --normalization RMSNorm --swiglu --ffn-hidden-size 704 --disable-bias-linear"
GPT="--ffn-hidden-size 1024"
# shellcheck disable=SC2086
"$M" pretrain $COMMON $LLAMA --metrics-jsonl "$RUN/llama.jsonl" > "$RUN/llama.log" 2>&1
# shellcheck disable=SC2086
"$M" pretrain $COMMON $GPT --metrics-jsonl "$RUN/gpt.jsonl" > "$RUN/gpt.log" 2>&1
python3 - "$RUN/llama.jsonl" "$RUN/gpt.jsonl" <<'PY'
import json, sys
def read(p):
    out = {}
    for line in open(p):
        d = json.loads(line)
        out.setdefault(d.get("tag"), {})[d.get("iteration")] = d["value"]
    return out
a, b = read(sys.argv[1]), read(sys.argv[2])
for it in sorted(a["lm loss"]):
    print(f"iter {it:4d}  llama lm loss {a['lm loss'][it]:.4f}  gpt lm loss {b['lm loss'].get(it, float('nan')):.4f}")
for tag in sorted(t for t in a if t and "validation" in t and "ppl" not in t):
    print(f"{tag}: llama {list(a[tag].values())[-1]:.4f}  gpt {list(b.get(tag, {0: float('nan')}).values())[-1]:.4f}")
for tag in ("iteration-time", "elapsed time per iteration (ms)"):
    if tag in a:
        print(f"{tag}: llama {list(a[tag].values())[-1]:.1f}  gpt {list(b[tag].values())[-1]:.1f}")
PY
