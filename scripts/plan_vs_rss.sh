#!/usr/bin/env bash
# `megatron plan` (predicted process bytes and step time) against the measured peak RSS (GNU
# time) and step time of `megatron pretrain` on the same flags, mock data, 2 iterations (Adam
# state exists after the first). Usage: scripts/plan_vs_rss.sh [path/to/megatron] [config-filter]
# Prints one row per config; the machine may be shared: say so next to the numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
M=${1:-target/release/megatron}
FILTER=${2:-}
[ -x "$M" ] || { echo "build $M first (cargo build --release)"; exit 1; }
gpt2="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --vocab-size 50257"
m350="--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --vocab-size 50257"
configs=(
  "124M-fp32      $gpt2 --seq-length 256 --micro-batch-size 2 --global-batch-size 2"
  "124M-fp32-mb4  $gpt2 --seq-length 256 --micro-batch-size 4 --global-batch-size 4"
  "124M-tp2       $gpt2 --seq-length 256 --micro-batch-size 2 --global-batch-size 2 --tensor-model-parallel-size 2 --nproc 2"
  "124M-pp2       $gpt2 --seq-length 256 --micro-batch-size 2 --global-batch-size 4 --pipeline-model-parallel-size 2 --nproc 2"
  "124M-dp2       $gpt2 --seq-length 256 --micro-batch-size 2 --global-batch-size 4 --nproc 2"
  "124M-dp2-dist  $gpt2 --seq-length 256 --micro-batch-size 2 --global-batch-size 4 --nproc 2 --use-distributed-optimizer"
  "124M-recomp    $gpt2 --seq-length 256 --micro-batch-size 2 --global-batch-size 2 --recompute-activations"
  "350M-fp32      $m350 --seq-length 256 --micro-batch-size 1 --global-batch-size 1"
  "350M-tp2       $m350 --seq-length 256 --micro-batch-size 1 --global-batch-size 1 --tensor-model-parallel-size 2 --nproc 2"
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common="--mock-data --train-iters 2 --lr 1e-4 --eval-iters 0 --eval-interval 1000 --log-interval 1 --skip-memory-check"
printf "%-14s %10s %10s %7s %9s %9s\n" config plan_GiB rss_GiB ratio plan_s step_s
for c in "${configs[@]}"; do
  name=${c%% *}; flags=${c#* }
  [[ -n "$FILTER" && "$name" != *$FILTER* ]] && continue
  # shellcheck disable=SC2086
  "$M" plan $flags $common --memory-budget 1T >"$tmp/plan" 2>&1 || { cat "$tmp/plan"; continue; }
  bytes=$(sed -n 's/.*process total.*(\([0-9]*\) bytes).*/\1/p' "$tmp/plan")
  pstep=$(sed -n 's/predicted step time: \([0-9.]*\) s.*/\1/p' "$tmp/plan")
  # shellcheck disable=SC2086
  /usr/bin/time -v "$M" pretrain $flags $common >"$tmp/out" 2>"$tmp/err" || { tail -5 "$tmp/err"; continue; }
  rss=$(awk '/Maximum resident/ {print $6 * 1024}' "$tmp/err")
  # Second iteration's elapsed time per iteration (ms) from the console line.
  step=$(grep -o 'elapsed time per iteration (ms): [0-9.]*' "$tmp/out" | tail -1 | awk '{print $NF / 1000}')
  awk -v n="$name" -v p="$bytes" -v r="$rss" -v ps="$pstep" -v s="$step" \
    'BEGIN {printf "%-14s %10.3f %10.3f %7.3f %9.3f %9.3f\n", n, p/2^30, r/2^30, p/r, ps, s}'
done
