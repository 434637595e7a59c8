#!/bin/bash
# Per-rank activation memory with and without --sequence-parallel (GPT-2 124M shape, seq 1024,
# tp2) and with and without --context-parallel-size 2 (issue 13), counted exactly by
# models/gpt/examples/activation_memory.rs (bytes of every tensor the decoder keeps for
# backward after one training forward; ranks as threads). Each pair prints the same loss.
# Then, with RSS=1, the peak RSS of real `megatron pretrain` runs of the SP pair (whole
# process = both ranks; parameters and Adam state are equal, the difference is activations).
# Run on a quiet machine: flock /work/heavy.lock scripts/sp_cp_memory.sh
# CP_LAYERS/CP_SEQ size the CP pair (the ring kernel is a plain host loop: defaults 2, 2048).
# DTYPE=bf16|fp16 measures the half model (`--bf16` / `--fp16`; default fp32); NO_CP=1 skips the
# CP pair. Byte counts and RSS do not depend on the build profile, so the dev build serves too:
# EX=target/debug/examples/activation_memory MEGATRON=target/debug/megatron.
set -e
DTYPE=${DTYPE:-fp32}
HALF=""
[ "$DTYPE" = fp32 ] || HALF="--$DTYPE"
EX=${EX:-target/release/examples/activation_memory}
[ -x "$EX" ] || cargo build --release -p megatron-gpt --example activation_memory
CP_LAYERS=${CP_LAYERS:-2}
CP_SEQ=${CP_SEQ:-2048}
echo "== sequence parallelism (LAYERS SEQ MBS TP CP SP)"
$EX 12 1024 1 2 1 0 "$DTYPE"
$EX 12 1024 1 2 1 1 "$DTYPE"
if [ -z "$NO_CP" ]; then
  echo "== context parallelism"
  $EX "$CP_LAYERS" "$CP_SEQ" 1 1 1 0 "$DTYPE"
  $EX "$CP_LAYERS" "$CP_SEQ" 1 1 2 0 "$DTYPE"
fi
if [ -n "$RSS" ]; then
  B=${MEGATRON:-target/release/megatron}  # RSS_LAYERS: decoder layers (default 4)
  F="pretrain --num-layers ${RSS_LAYERS:-4} --hidden-size 768 --num-attention-heads 12 --seq-length 1024
     --max-position-embeddings 1024 --micro-batch-size 4 --global-batch-size 4 --train-iters 2 --lr 1e-4
     --mock-data --vocab-size 50257 --eval-iters 0 --eval-interval 1000 --log-interval 1
     --hidden-dropout 0 --attention-dropout 0 --nproc 2 --tensor-model-parallel-size 2 $HALF"
  for extra in "" "--sequence-parallel"; do
    echo "== RSS tp2 $DTYPE $extra"
    /usr/bin/time -f "maxrss_kb %M wall %e" $B $F $extra 2>&1 | grep -E "iteration |maxrss|rror" | tail -3
  done
fi
