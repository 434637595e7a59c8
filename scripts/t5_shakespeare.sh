#!/usr/bin/env bash
# T5 pretraining on tiny Shakespeare (issue 16): BERT uncased vocab + 100 extra ids,
# sentence-split, Megatron's span corruption; the same run at tp1, tp2 and dp2 (ranks as
# threads), then the loss columns side by side.
#   RUN=dir ITERS=n bash scripts/t5_shakespeare.sh
# Needs ../shared/data (tinyshakespeare.jsonl, bert-base-uncased/vocab.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-/tmp/t5_shakespeare}
ITERS=${ITERS:-300}
DATA=${DATA:-../shared/data}
M=${M:-target/release/megatron}
[ -x "$M" ] || cargo build --release
mkdir -p "$RUN"
VOCAB=$DATA/bert-base-uncased/vocab.txt
if [ ! -f "$RUN/shakespeare_text_sentence.idx" ]; then
  $M preprocess --input "$DATA/tinyshakespeare.jsonl" --output-prefix "$RUN/shakespeare" \
    --tokenizer-type BertWordPieceLowerCase --vocab-file "$VOCAB" --split-sentences --workers 2
fi
PREFIX=$(ls "$RUN"/shakespeare_text_sentence.idx | sed 's/\.idx$//')
COMMON=(--model t5 --num-layers 2 --hidden-size 128 --num-attention-heads 4 --ffn-hidden-size 512
  --seq-length 128 --decoder-seq-length 64 --max-position-embeddings 128
  --micro-batch-size 8 --global-batch-size 16 --train-iters "$ITERS" --lr 1e-3 --min-lr 1e-4
  --lr-decay-style cosine --lr-warmup-iters 30 --weight-decay 0.01 --clip-grad 1.0
  --hidden-dropout 0.0 --attention-dropout 0.0
  --data-path "$PREFIX" --split 98,2,0 --eval-interval 100 --eval-iters 5 --log-interval 10
  --tokenizer-type BertWordPieceLowerCase --vocab-file "$VOCAB" --vocab-extra-ids 100 --seed 1234)
$M pretrain "${COMMON[@]}" 2>&1 | tee "$RUN/tp1.log"
$M pretrain "${COMMON[@]}" --nproc 2 --tensor-model-parallel-size 2 2>&1 | tee "$RUN/tp2.log"
$M pretrain "${COMMON[@]}" --nproc 2 2>&1 | tee "$RUN/dp2.log"
echo "iteration  tp1  tp2  dp2 (lm loss)"
paste <(grep -o 'iteration *[0-9]*/' "$RUN/tp1.log" | tr -dc '0-9\n') \
      <(grep -o 'lm loss: [0-9.E+-]*' "$RUN/tp1.log" | awk '{print $3}') \
      <(grep -o 'lm loss: [0-9.E+-]*' "$RUN/tp2.log" | awk '{print $3}') \
      <(grep -o 'lm loss: [0-9.E+-]*' "$RUN/dp2.log" | awk '{print $3}')
