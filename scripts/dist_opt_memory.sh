#!/bin/bash
# Peak RSS of GPT-2 124M (seq 1024, mock data), 2 ranks as threads at dp2, 8M-element DDP
# buckets, with and without --use-distributed-optimizer (issue 13). Both runs must log the
# same losses and grad norms. Run on a quiet machine: flock /work/heavy.lock scripts/dist_opt_memory.sh
# EXTRA adds flags to both runs, e.g. EXTRA=--bf16 flock /work/heavy.lock scripts/dist_opt_memory.sh
set -e
B=${MEGATRON:-target/release/megatron}
F="pretrain --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024
   --micro-batch-size 1 --global-batch-size 2 --train-iters 2 --lr 1e-4 --mock-data --vocab-size 50257
   --eval-iters 0 --eval-interval 1000 --log-interval 1 --nproc 2 --ddp-bucket-size 8000000 ${EXTRA:-}"
for extra in "" "--use-distributed-optimizer"; do
  echo "== dp2 ${EXTRA:-} $extra"
  /usr/bin/time -f "maxrss_kb %M wall %e" $B $F $extra 2>&1 | grep -E "iteration |maxrss|rror" | tail -3
done
