#!/usr/bin/env bash
# Step time of the distributed optimizer at dp2 with and without --overlap-param-gather
# (release binary; run under `flock /work/heavy.lock` on a shared machine).
#
# The model is small in tokens but not in parameters (4 layers, hidden 512, vocab 8192 ≈ 17M
# parameters, 32 tokens per rank per step), so the parameter all-gather is a visible share of
# a step; 1M-element buckets give ~17 buckets, so the first layers' gathers land while later
# ones are still in flight. Each mode runs REPS times, alternating; the per-iteration time is
# the mean of the log intervals after the first (warm-up). Usage:
#   cargo build --release --bin megatron
#   flock /work/heavy.lock scripts/overlap_param_gather_timing.sh
set -euo pipefail
BIN=${BIN:-target/release/megatron}
ITERS=${ITERS:-40}
REPS=${REPS:-3}
common="--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 32 --max-position-embeddings 32 \
  --micro-batch-size 1 --global-batch-size 2 --mock-data --vocab-size 8192 --lr 1e-4 --train-iters $ITERS \
  --log-interval 10 --eval-iters 0 --nproc 2 --threads 1 --hidden-dropout 0 --attention-dropout 0 \
  --use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 1000000"
ms() { # mean elapsed ms/iteration of the log lines after the first
  grep -o 'elapsed time per iteration (ms): [0-9.]*' | awk 'NR > 1 { s += $NF; n++ } END { printf "%.1f", s / n }'
}
for rep in $(seq "$REPS"); do
  for mode in sync overlap; do
    extra=""
    [ "$mode" = overlap ] && extra="--overlap-param-gather"
    out=$("$BIN" pretrain $common $extra 2>&1)
    loss=$(echo "$out" | grep -o 'lm loss: [0-9.E+-]*' | tail -1)
    echo "rep $rep $mode: $(echo "$out" | ms) ms/iteration ($loss)"
  done
done
