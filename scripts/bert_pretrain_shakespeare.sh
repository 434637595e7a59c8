#!/usr/bin/env bash
# BERT pretraining on tiny Shakespeare (issue 15): sentence-split with `megatron preprocess`
# (BertWordPieceLowerCase, bert-base-uncased vocab), then ITERS (300) iterations of a 2-layer,
# 128-hidden BERT with the binary head (seq 64, global batch 8, Adam, warmup + cosine) through
# models/bert/examples/pretrain_shakespeare.rs; prints `lm loss` and `sop loss` every 10.
# (Not yet `megatron pretrain --model bert`, see the example's doc.)
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
OUT=${OUT:-$(mktemp -d)}
ITERS=${ITERS:-300}
cargo build --release --bin megatron
cargo build --release -p megatron-bert --example pretrain_shakespeare
target/release/megatron preprocess --input "$DATA/tinyshakespeare.jsonl" --output-prefix "$OUT/shakes" \
  --tokenizer-type BertWordPieceLowerCase --vocab-file "$DATA/bert-base-uncased/vocab.txt" --split-sentences --workers 1
target/release/examples/pretrain_shakespeare "$OUT/shakes_text_sentence" "$DATA/bert-base-uncased/vocab.txt" \
  "$ITERS" 64 8 128 2 10
