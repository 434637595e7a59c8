#!/bin/bash
# Peak RSS of GPT-2 124M shapes (mock data, fp32), ranks as threads of one process, with and
# without --sequence-parallel at tp2, and with and without --context-parallel-size 2 (issue 13).
# Each pair must log the same losses. RSS is the whole process (all ranks + the shared
# allocator), so per-rank figures are RSS / nproc; parameters and Adam state are the same in
# both runs of a pair, the difference is activations.
# Run on a quiet machine: flock /work/heavy.lock scripts/sp_cp_memory.sh
# SEQ/LAYERS/MBS shrink it when time is short (defaults: 1024, 12, 4).
set -e
B=${MEGATRON:-target/release/megatron}
SEQ=${SEQ:-1024}
LAYERS=${LAYERS:-12}
MBS=${MBS:-4}
F="pretrain --num-layers $LAYERS --hidden-size 768 --num-attention-heads 12 --seq-length $SEQ
   --max-position-embeddings $SEQ --micro-batch-size $MBS --global-batch-size $MBS --train-iters 2 --lr 1e-4
   --mock-data --vocab-size 50257 --eval-iters 0 --eval-interval 1000 --log-interval 1
   --hidden-dropout 0 --attention-dropout 0 --skip-memory-check"
run() {
  echo "== $*"
  /usr/bin/time -f "maxrss_kb %M wall %e" $B $F "$@" 2>&1 | grep -E "iteration |maxrss|rror" | tail -3
}
if [ -z "$CP_ONLY" ]; then
  run --nproc 2 --tensor-model-parallel-size 2
  run --nproc 2 --tensor-model-parallel-size 2 --sequence-parallel
fi
if [ -n "$CP" ]; then
  run --nproc 1
  run --nproc 2 --context-parallel-size 2
fi
