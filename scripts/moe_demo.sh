#!/usr/bin/env bash
# Issue 17 demonstration: a GPT with MoE MLPs (8 experts, top-2) on tiny Shakespeare, through
# the plugin library (--plugin target/release/libmegatron_moe.so) and through the rlib (feature
# `moe`, a second binary), next to the dense model of equal active MLP parameters
# (dense ffn = topk x expert ffn). Prints the log lines; compare the lm losses.
# Usage: bash scripts/moe_demo.sh [ITERS]   (SHARED=../shared, OUT=/tmp/moe_demo)
set -euo pipefail
ITERS=${1:-60}
SHARED=${SHARED:-../shared}
OUT=${OUT:-/tmp/moe_demo}
mkdir -p "$OUT"
cargo build --release -p megatron -p megatron-moe
DATA="--data-path $SHARED/data/tinyshakespeare_gpt2_text_document --split 98,2,0 --tokenizer-type GPT2BPETokenizer
  --vocab-file $SHARED/data/gpt2/vocab.json --merge-file $SHARED/data/gpt2/merges.txt"
MODEL="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 4
  --global-batch-size 8 --train-iters $ITERS --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine
  --lr-warmup-iters 5 --clip-grad 1.0 --log-interval 5 --eval-interval 1000 --eval-iters 0 --seed 1234"
MOE="--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 128 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3"
# shellcheck disable=SC2086
target/release/megatron --plugin target/release/libmegatron_moe.so pretrain $MODEL $DATA $MOE | tee "$OUT/moe_plugin.log"
# shellcheck disable=SC2086
target/release/megatron pretrain $MODEL $DATA --ffn-hidden-size 256 | tee "$OUT/dense.log"
# The rlib: the same binary rebuilt with the plugin linked in (only the megatron crate recompiles).
cargo build --release --features moe -p megatron
# shellcheck disable=SC2086
target/release/megatron pretrain $MODEL $DATA $MOE | tee "$OUT/moe_rlib.log"
cargo build --release -p megatron   # back to the default binary
for f in moe_plugin moe_rlib dense; do
  grep -o 'lm loss: [0-9.E+-]*' "$OUT/$f.log" | awk '{print $3}' > "$OUT/$f.loss"
done
if cmp -s "$OUT/moe_plugin.loss" "$OUT/moe_rlib.loss"; then
  echo "plugin library and rlib feature: identical lm losses"
else
  echo "plugin library and rlib feature: losses DIFFER"; exit 1
fi
paste "$OUT/moe_plugin.loss" "$OUT/dense.loss" | awk '{printf "log %2d  moe %s  dense %s\n", NR, $1, $2}'
