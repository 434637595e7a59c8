#!/usr/bin/env bash
# Compares `megatron pretrain`'s memory estimate (src/train/memory.rs) with the measured peak
# RSS (GNU time) on a few mock-data configs, one training iteration each (Adam state exists
# after the first step). Usage: scripts/memory_estimate.sh [path/to/megatron]
set -euo pipefail
cd "$(dirname "$0")/.."
M=${1:-target/release/megatron}
[ -x "$M" ] || cargo build --release
configs=(
  "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 --micro-batch-size 8 --vocab-size 50257"
  "--num-layers 8 --hidden-size 384 --num-attention-heads 6 --seq-length 256 --micro-batch-size 4 --vocab-size 32000"
  "--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 4096 --micro-batch-size 2 --vocab-size 1000"
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf "%-10s %-10s %-6s  %s\n" "estimate" "peak RSS" "ratio" "config"
for cfg in "${configs[@]}"; do
  # shellcheck disable=SC2086
  /usr/bin/time -v "$M" pretrain $cfg --mock-data --train-iters 1 --lr 1e-4 --eval-iters 1 --eval-interval 1 \
    >"$tmp/out" 2>"$tmp/err"
  est=$(sed -n 's/.*memory estimate: \([0-9.]*\) GiB.*/\1/p' "$tmp/out")
  rss=$(awk '/Maximum resident/ {printf "%.3f", $6 / 1048576}' "$tmp/err")
  printf "%-10s %-10s %-6s  %s\n" "$est GiB" "$rss GiB" "$(awk -v e="$est" -v r="$rss" 'BEGIN {printf "%.2f", e / r}')" "$cfg"
done
