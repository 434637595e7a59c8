#!/usr/bin/env bash
# Issue 16 measurements in release (run under `flock /work/heavy.lock`): the cross-attention
# bench next to self-attention, then the small T5 Shakespeare run (h64, 2+2 layers, enc 64 /
# dec 32, mbs 4, gbs 8, 300 iterations) at tp1 and tp2, losses side by side.
#   RUN=dir ITERS=n bash scripts/t5_release_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-/tmp/t5_release}
ITERS=${ITERS:-300}
DATA=${DATA:-../shared/data}
M=target/release/megatron
cargo build --release --bin megatron
mkdir -p "$RUN"
[ "${SKIP_BENCH:-0}" = 1 ] || timeout 300 cargo bench -p megatron-cpu --bench cross_attention 2>&1 | tee "$RUN/bench.log"
VOCAB=$DATA/bert-base-uncased/vocab.txt
if [ ! -f "$RUN/shakespeare_text_sentence.idx" ]; then
  $M preprocess --input "$DATA/tinyshakespeare.jsonl" --output-prefix "$RUN/shakespeare" \
    --tokenizer-type BertWordPieceLowerCase --vocab-file "$VOCAB" --split-sentences --workers 1
fi
COMMON=(--model t5 --num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 256
  --seq-length 64 --decoder-seq-length 32 --max-position-embeddings 64
  --micro-batch-size 4 --global-batch-size 8 --train-iters "$ITERS" --lr 1e-3 --min-lr 1e-4
  --lr-decay-style cosine --lr-warmup-iters 30 --weight-decay 0.01 --clip-grad 1.0
  --hidden-dropout 0.0 --attention-dropout 0.0
  --data-path "$RUN/shakespeare_text_sentence" --split 98,2,0 --eval-interval 100 --eval-iters 5
  --log-interval 10 --tokenizer-type BertWordPieceLowerCase --vocab-file "$VOCAB"
  --vocab-extra-ids 100 --seed 1234)
for cfg in tp1 tp2; do
  extra=()
  [ $cfg = tp2 ] && extra=(--nproc 2 --tensor-model-parallel-size 2)
  start=$(date +%s)
  timeout 300 $M pretrain "${COMMON[@]}" "${extra[@]}" --save "$RUN/ckpt_$cfg" --save-interval "$ITERS" \
    > "$RUN/$cfg.log" 2>&1 || echo "$cfg exited with $?"
  echo "$cfg: $(( $(date +%s) - start )) s"
done
echo "iteration  tp1  tp2 (lm loss)"
paste <(grep -o 'iteration *[0-9]*/' "$RUN/tp1.log" | tr -dc '0-9\n') \
      <(grep -o 'lm loss: [0-9.E+-]*' "$RUN/tp1.log" | awk '{print $3}') \
      <(grep -o 'lm loss: [0-9.E+-]*' "$RUN/tp2.log" | awk '{print $3}')
grep -i "validation" "$RUN/tp1.log" "$RUN/tp2.log" | cut -c1-200
# Generation from the tp1 checkpoint: KV cache vs full recompute (greedy, 31 new tokens).
P="first citizen : before we proceed any further , hear me speak ."
for flag in "" --no-kv-cache; do
  $M generate --load "$RUN/ckpt_tp1" --prompt "$P" --top-k 1 --tokens-to-generate 31 $flag 2>&1 | tail -2
done
$M generate --load "$RUN/ckpt_tp2" --prompt "$P" --top-k 1 --tokens-to-generate 31 2>&1 | tail -2
