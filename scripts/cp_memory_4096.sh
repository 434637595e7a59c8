#!/bin/bash
# Context-parallel memory at seq 4096 (issue 13, item 3): GPT-2 124M widths (hidden 768, 12
# heads, vocab 50257) with LAYERS decoder layers (default 2: the ring attention is a host loop),
# one iteration of micro batch 1, peak RSS of the process:
#   cp1 (1 rank), dp2 (2 ranks, full sequence each) and cp2 (2 ranks, half the sequence each).
# dp2 and cp2 hold the same parameters, gradients and Adam state (two replicas), so
# (dp2 - cp2) / 2 is what context parallelism saves per rank in activations. Losses must agree.
# Run on a quiet machine: flock /work/heavy.lock scripts/cp_memory_4096.sh
# EXTRA adds flags to every run, e.g. EXTRA=--bf16 (context parallelism in half precision).
set -e
B=${MEGATRON:-target/release/megatron}
L=${LAYERS:-2}
F="pretrain --num-layers $L --hidden-size 768 --num-attention-heads 12 --seq-length 4096
   --max-position-embeddings 4096 --micro-batch-size 1 --train-iters 1 --lr 1e-4 --mock-data
   --vocab-size 50257 --eval-iters 0 --eval-interval 1000 --log-interval 1 --attention-dropout 0
   --hidden-dropout 0 ${EXTRA:-}"
for extra in "--nproc 1" "--nproc 2 --global-batch-size 2" "--nproc 2 --context-parallel-size 2"; do
  echo "== $extra"
  /usr/bin/time -f "maxrss_kb %M wall_s %e" $B $F $extra 2>&1 | grep -E "maxrss|rror|lm loss" \
    | sed -E 's/.*(lm loss: [0-9.E+-]+).*(grad norm: [0-9.]+).*/\1 \2/'
done
