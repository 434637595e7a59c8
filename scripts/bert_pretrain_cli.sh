#!/usr/bin/env bash
# BERT pretraining on tiny Shakespeare through the CLI (issue 15, item 2): sentence-split with
# `megatron preprocess` (BertWordPieceLowerCase, bert-base-uncased vocab), then
# `megatron pretrain --model bert` for ITERS (300) iterations of a 2-layer, 128-hidden BERT with
# the binary head (seq 64, global batch 8, Adam, warmup + cosine), logging `lm loss` and
# `sop loss` every 10 iterations. LAYOUT="--nproc 2 --tensor-model-parallel-size 2" runs tp2,
# LAYOUT="--nproc 4 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2" tp2·pp2;
# MBS (8) sets the micro batch size (4 gives two microbatches per step: a real 1F1B pipeline);
# EXTRA adds flags (e.g. "--hidden-dropout 0 --attention-dropout 0" for layout parity).
# PROFILE=debug uses the dev build (opt-level 2) instead of a release build; NO_BUILD=1 skips cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
OUT=${OUT:-$(mktemp -d)}
ITERS=${ITERS:-300}
PROFILE=${PROFILE:-release}
LAYOUT=${LAYOUT:-}
MBS=${MBS:-8}
EXTRA=${EXTRA:-}
if [ -z "${NO_BUILD:-}" ]; then
  if [ "$PROFILE" = release ]; then cargo build --release --bin megatron; else cargo build --bin megatron; fi
fi
M=target/$PROFILE/megatron
VOCAB=$DATA/bert-base-uncased/vocab.txt
[ -f "$OUT/shakes_text_sentence.idx" ] || $M preprocess --input "$DATA/tinyshakespeare.jsonl" \
  --output-prefix "$OUT/shakes" --tokenizer-type BertWordPieceLowerCase --vocab-file "$VOCAB" --split-sentences --workers 1
# shellcheck disable=SC2086
$M pretrain --model bert --num-layers 2 --hidden-size 128 --num-attention-heads 2 --seq-length 64 \
  --max-position-embeddings 64 --micro-batch-size "$MBS" --global-batch-size 8 --train-iters "$ITERS" \
  --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 30 --weight-decay 0.01 --clip-grad 1.0 \
  --seed 1234 --split 949,50,1 --eval-interval 100 --eval-iters 5 --log-interval 10 \
  --data-path "$OUT/shakes_text_sentence" --tokenizer-type BertWordPieceLowerCase --vocab-file "$VOCAB" $LAYOUT $EXTRA
