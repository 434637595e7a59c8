#!/usr/bin/env bash
# Issue 11 item 3: peak RSS of the GPT-2 124M training step (12 layers, 768 hidden, seq 1024,
# micro batch 4, vocab 50257, mock data) for fp32, --bf16, --bf16 with selective recompute
# (core_attn) and --bf16 with full uniform recompute (1 layer per unit), next to the hand count
# of docs/mixed_precision.md. ITERS iterations each (peak reached in the first).
#   M=target/release/megatron ITERS=2 flock /work/heavy.lock bash scripts/recompute_memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
M="${M:-target/release/megatron}"
ITERS="${ITERS:-2}"
OUT="${OUT:-$(mktemp -d /tmp/recompute_memory.XXXXXX)}"
FLAGS="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 \
  --micro-batch-size 4 --global-batch-size 4 --train-iters $ITERS --lr 1e-4 --mock-data --vocab-size 50257 \
  --log-interval 1 --eval-interval 1000000 --eval-iters 0 --threads 2 --skip-memory-check"
mkdir -p "$OUT"; echo "outputs in $OUT"
for run in "fp32:" "bf16:--bf16" "bf16-selective:--bf16 --recompute-granularity selective" \
  "bf16-full-uniform-1:--bf16 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"; do
  name=${run%%:*}; extra=${run#*:}
  # shellcheck disable=SC2086
  /usr/bin/time -f "maxrss_kb %M" "$M" pretrain $FLAGS $extra > "$OUT/$name.log" 2>&1 \
    || { echo "run $name failed, see $OUT/$name.log" >&2; tail -5 "$OUT/$name.log" >&2; exit 1; }
  rss=$(grep -o "maxrss_kb [0-9]*" "$OUT/$name.log" | awk '{printf "%.0f", $2/1024}')
  loss=$(grep -o "lm loss: [0-9.E+-]*" "$OUT/$name.log" | tail -1)
  echo "$name: peak RSS ${rss} MiB ($loss)"
done
