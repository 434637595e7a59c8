#!/usr/bin/env bash
# Issue 18 demonstration: an all-Mamba-2 model, a hybrid (Mamba-2 / attention / MLP) and a GPT
# of similar size trained on tiny Shakespeare (GPT-2 BPE), loss columns side by side.
# Usage: bash scripts/hybrid_shakespeare.sh [ITERS]   (SHARED=../shared, OUT=/tmp/hybrid_shakespeare,
# M=path/to/megatron; default the dev-profile binary, built if absent)
# Sizes (hidden 128, GPT-2 vocabulary 50304 x 128 = 6.4M embedding parameters, tied):
#   gpt    4 layers                     0.79M non-embedding parameters
#   mamba  7 x M  (H 8, P 32, N 32, G 1) 0.77M
#   hybrid M*-M*-M- (3 M, 2 attention, 3 MLP) 0.86M
set -euo pipefail
cd "$(dirname "$0")/.."
ITERS=${1:-60}
SHARED=${SHARED:-../shared}
OUT=${OUT:-/tmp/hybrid_shakespeare}
M=${M:-target/debug/megatron}
[ -x "$M" ] || cargo build -p megatron
mkdir -p "$OUT"
COMMON=(--hidden-size 128 --num-attention-heads 4 --seq-length 64 --micro-batch-size 4 --global-batch-size 8
  --train-iters "$ITERS" --lr 2e-3 --min-lr 2e-4 --lr-decay-style cosine --lr-warmup-iters 6 --weight-decay 0.1
  --clip-grad 1.0 --hidden-dropout 0.0 --attention-dropout 0.0 --normalization RMSNorm --seed 1234
  --data-path "$SHARED/data/tinyshakespeare_gpt2_text_document" --split 98,2,0 --data-cache-path "$OUT/cache"
  --tokenizer-type GPT2BPETokenizer --vocab-file "$SHARED/data/gpt2/vocab.json"
  --merge-file "$SHARED/data/gpt2/merges.txt" --log-interval 5 --eval-interval "$ITERS" --eval-iters 10)
MAMBA=(--mamba-state-dim 32 --mamba-head-dim 32 --mamba-num-groups 1)
$M pretrain "${COMMON[@]}" --num-layers 4 2>&1 | tee "$OUT/gpt.log"
$M pretrain "${COMMON[@]}" --model mamba --num-layers 7 "${MAMBA[@]}" 2>&1 | tee "$OUT/mamba.log"
$M pretrain "${COMMON[@]}" --model hybrid --num-layers 8 --hybrid-layer-pattern 'M*-M*-M-' "${MAMBA[@]}" 2>&1 \
  | tee "$OUT/hybrid.log"
for f in gpt mamba hybrid; do
  grep -o 'lm loss: [0-9.E+-]*' "$OUT/$f.log" | awk '{print $3}' > "$OUT/$f.loss"
done
echo "iteration  gpt  mamba  hybrid (lm loss; the last row of each log is the validation loss)"
paste <(seq 5 5 100000 | head -n "$(wc -l < "$OUT/gpt.loss")") "$OUT/gpt.loss" "$OUT/mamba.loss" "$OUT/hybrid.loss"
