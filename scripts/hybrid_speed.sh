#!/usr/bin/env bash
# Issue 18 item 4: speed of the Mamba-2 model vs a GPT of about the same size (CPU backend).
#  1. training tokens/s at seq 1024 and 4096 (mock data, micro batch 1, a few iterations; the
#     median ms/iteration of the logged iterations after the first);
#  2. generation ms/token at long context: a checkpoint of each model (1 training iteration,
#     mock data), then `megatron generate` after prompts of P tokens, timed with 1 and 1 + N
#     new tokens; ms/token = (t(1 + N) - t(1)) / N from the times `generate` reports (prompt
#     and generation, model loading excluded), so the prompt cancels out.
#   REUSE=1 with PARTS=gen re-reads the generate logs already in $OUT instead of running them.
# Usage: M=target/release/megatron flock /work/heavy.lock bash scripts/hybrid_speed.sh
#   (OUT=/tmp/hybrid_speed, ITERS=4, SEQS="1024 4096", PROMPTS="256 1024 4096", NEW=128,
#    PARTS="train gen": which of the two to run; sizes: HIDDEN=128, HEADS=4, VOCAB=1024,
#    GPT_LAYERS=6, MAMBA_LAYERS=10, MAMBA_STATE=32, MAMBA_HEAD_DIM=32, MBS=1; EXTRA="..." is
#    added to every pretrain command, e.g. EXTRA="--threads 2")
# Default sizes (hidden 128, vocab 1024): gpt 6 layers (1.19M non-embedding parameters), mamba
# 10 x M (H 8, P 32, N 32, G 1; 1.09M). Each line reports both models' numbers from the same run
# and their ratio; the load average is printed first (the numbers mean little on a busy machine).
set -euo pipefail
cd "$(dirname "$0")/.."
M=${M:-target/release/megatron}
OUT=${OUT:-/tmp/hybrid_speed}
ITERS=${ITERS:-4}
SEQS=${SEQS:-"1024 4096"}
PROMPTS=${PROMPTS:-"256 1024 4096"}
NEW=${NEW:-128}
PARTS=${PARTS:-"train gen"}
HIDDEN=${HIDDEN:-128}
HEADS=${HEADS:-4}
VOCAB=${VOCAB:-1024}
GPT_LAYERS=${GPT_LAYERS:-6}
MAMBA_LAYERS=${MAMBA_LAYERS:-10}
MAMBA_STATE=${MAMBA_STATE:-32}
MAMBA_HEAD_DIM=${MAMBA_HEAD_DIM:-32}
MBS=${MBS:-1}
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
mkdir -p "$OUT"
echo "== $(date -u +%FT%TZ) $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $M"
COMMON=(--hidden-size "$HIDDEN" --num-attention-heads "$HEADS" --micro-batch-size "$MBS" --global-batch-size "$MBS"
  --lr 1e-3 --hidden-dropout 0 --attention-dropout 0 --normalization RMSNorm --mock-data --vocab-size "$VOCAB"
  --seed 1 --log-interval 1 --eval-iters 0 --eval-interval 100000 "${EXTRA_ARGS[@]}")
GPT=(--num-layers "$GPT_LAYERS")
MAMBA=(--model mamba --num-layers "$MAMBA_LAYERS" --mamba-state-dim "$MAMBA_STATE" --mamba-head-dim "$MAMBA_HEAD_DIM"
  --mamba-num-groups 1)
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

if [[ $PARTS == *train* ]]; then
echo "== training tokens/s (micro batch $MBS, median of iterations 2..$ITERS)"
for seq in $SEQS; do
  declare -A tps=()
  for m in gpt mamba; do
    if [ $m = gpt ]; then A=("${GPT[@]}"); else A=("${MAMBA[@]}"); fi
    log="$OUT/train_${m}_$seq.log"
    $M pretrain "${COMMON[@]}" "${A[@]}" --seq-length "$seq" --max-position-embeddings "$seq" \
      --train-iters "$ITERS" > "$log" 2>&1
    ms=$(grep -o 'elapsed time per iteration (ms): [0-9.]*' "$log" | awk '{print $6}' | tail -n +2 | median)
    tps[$m]=$(awk -v s="$seq" -v b="$MBS" -v ms="$ms" 'BEGIN {printf "%.0f", s * b * 1000 / ms}')
    echo "$m seq $seq: $ms ms/iteration, ${tps[$m]} tokens/s"
  done
  echo "seq $seq: mamba / gpt tokens/s = $(awk -v a="${tps[mamba]}" -v b="${tps[gpt]}" 'BEGIN {printf "%.2f", a / b}')"
done

fi
[[ $PARTS == *gen* ]] || exit 0
echo "== generation ms/token after a prompt of P tokens ($NEW new tokens, greedy)"
maxp=$(echo $PROMPTS | tr ' ' '\n' | sort -n | tail -1)
for m in gpt mamba; do
  [ -n "${REUSE:-}" ] && [ -d "$OUT/ckpt_$m" ] && continue
  if [ $m = gpt ]; then A=("${GPT[@]}"); else A=("${MAMBA[@]}"); fi
  rm -rf "$OUT/ckpt_$m"
  $M pretrain "${COMMON[@]}" "${A[@]}" --seq-length 64 --max-position-embeddings $((maxp + NEW + 8)) \
    --train-iters 1 --save "$OUT/ckpt_$m" --save-interval 1 > "$OUT/save_$m.log" 2>&1
done
# Seconds `megatron generate` reports (model loading excluded): GPT, prompt + generation (the
# prompt cancels in the difference); the recurrent models report the generation alone (their
# step-by-step prompt time is noisy on a loaded machine and would not cancel as well).
gen_secs() {
  sed -n 's/.*prompt [0-9]* tokens in [0-9.]*s, generated [0-9]* tokens in \([0-9.]*\)s.*/\1/p;
          s/^generated [0-9]* tokens in \([0-9.]*\)s.*/\1/p' "$1" | tail -1
}
for p in $PROMPTS; do
  prompt=$(seq 1 "$p" | awk '{printf "%d ", ($1 * 7) % 1000}')
  for m in gpt mamba; do
    for n in 1 $((NEW + 1)); do
      [ -n "${REUSE:-}" ] && [ -s "$OUT/gen_${m}_${p}_$n.log" ] && continue
      $M generate --load "$OUT/ckpt_$m" --prompt "$prompt" --top-k 1 --tokens-to-generate "$n" \
        > "$OUT/gen_${m}_${p}_$n.log" 2>&1
    done
    t1=$(gen_secs "$OUT/gen_${m}_${p}_1.log")
    tn=$(gen_secs "$OUT/gen_${m}_${p}_$((NEW + 1)).log")
    echo "$m prompt $p: $(echo "scale=2; 1000 * ($tn - $t1) / $NEW" | bc -l) ms/token (1 token: ${t1}s, $((NEW + 1)) tokens: ${tn}s)"
  done
done
