#!/usr/bin/env bash
# Issue 18 demonstration: an all-Mamba-2 model, a hybrid (Mamba-2 / attention / MLP) and a GPT
# of similar size trained on tiny Shakespeare (GPT-2 BPE), loss columns side by side.
# Usage: bash scripts/hybrid_shakespeare.sh [ITERS]   (SHARED=../shared, OUT=/tmp/hybrid_shakespeare,
# M=path/to/megatron; default the dev-profile binary, built if absent; for numbers use the
# release binary under the heavy lock: M=target/release/megatron flock /work/heavy.lock bash ...)
# Sizes (hidden 128, GPT-2 vocabulary 50304 x 128 = 6.4M embedding parameters, tied):
#   gpt    6 layers                            1.19M non-embedding parameters
#   mamba  10 x M  (H 8, P 32, N 32, G 1)      1.09M
#   hybrid M-M*-M-M*- (4 M, 2 attention, 4 MLP) 1.09M
set -euo pipefail
cd "$(dirname "$0")/.."
ITERS=${1:-300}
SHARED=${SHARED:-../shared}
OUT=${OUT:-/tmp/hybrid_shakespeare}
M=${M:-target/debug/megatron}
MODELS=${MODELS:-"gpt mamba hybrid"}  # run a subset (e.g. one model per heavy-lock turn)
MBS=${MBS:-4}
GBS=${GBS:-8}
[ -x "$M" ] || cargo build -p megatron
mkdir -p "$OUT"
COMMON=(--hidden-size 128 --num-attention-heads 4 --seq-length 64 --micro-batch-size "$MBS" --global-batch-size "$GBS"
  --train-iters "$ITERS" --lr 2e-3 --min-lr 2e-4 --lr-decay-style cosine --lr-warmup-iters 6 --weight-decay 0.1
  --clip-grad 1.0 --hidden-dropout 0.0 --attention-dropout 0.0 --normalization RMSNorm --seed 1234
  --data-path "$SHARED/data/tinyshakespeare_gpt2_text_document" --split 98,2,0 --data-cache-path "$OUT/cache"
  --tokenizer-type GPT2BPETokenizer --vocab-file "$SHARED/data/gpt2/vocab.json"
  --merge-file "$SHARED/data/gpt2/merges.txt" --log-interval 25 --eval-interval "$ITERS" --eval-iters 10)
MAMBA=(--mamba-state-dim 32 --mamba-head-dim 32 --mamba-num-groups 1)
for f in $MODELS; do
  case $f in
    gpt) A=(--num-layers 6) ;;
    mamba) A=(--model mamba --num-layers 10 "${MAMBA[@]}") ;;
    hybrid) A=(--model hybrid --num-layers 10 --hybrid-layer-pattern 'M-M*-M-M*-' "${MAMBA[@]}") ;;
  esac
  $M pretrain "${COMMON[@]}" "${A[@]}" 2>&1 | tee "$OUT/$f.log"
done
for f in gpt mamba hybrid; do
  [ -f "$OUT/$f.log" ] || continue
  grep -o 'lm loss: [0-9.E+-]*' "$OUT/$f.log" | awk '{print $3}' > "$OUT/$f.loss"
done
echo "iteration  gpt  mamba  hybrid (lm loss; the last row of each log is the validation loss)"
paste <(seq 25 25 100000 | head -n "$(wc -l < "$OUT/gpt.loss")") "$OUT"/{gpt,mamba,hybrid}.loss
