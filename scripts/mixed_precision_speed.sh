#!/usr/bin/env bash
# GPT-2 124M shape (12 layers, 768 hidden, 12 heads, seq 1024, micro batch 4, vocab 50257, mock
# data): training tokens/s and peak RSS of fp32, --bf16 and --fp16 in one run, next to PyTorch
# eager (bf16 autocast and fp32) on the same threads, measured in the same session.
#   M=target/release/megatron THREADS=2 ITERS=4 flock /work/heavy.lock bash scripts/mixed_precision_speed.sh
# tokens/s: mean over the iterations after the first (the log line's elapsed time per iteration).
set -euo pipefail
cd "$(dirname "$0")/.."
M="${M:-target/release/megatron}"
THREADS="${THREADS:-2}"
ITERS="${ITERS:-4}"
PY="${PYTHON:-/work/venv/bin/python}"
OUT="${OUT:-$(mktemp -d /tmp/mixed_precision_speed.XXXXXX)}"
FLAGS="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 \
  --micro-batch-size 4 --global-batch-size 4 --train-iters $ITERS --lr 1e-4 --mock-data --vocab-size 50257 \
  --hidden-dropout 0 --attention-dropout 0 --log-interval 1 --eval-interval 1000000 --eval-iters 0 \
  --threads $THREADS --skip-memory-check"
mkdir -p "$OUT"; echo "outputs in $OUT; $(nproc) cores (shared machine), $THREADS threads"
for run in "fp32:" "bf16:--bf16" "fp16:--fp16 --initial-loss-scale 65536"; do
  name=${run%%:*}; extra=${run#*:}
  # shellcheck disable=SC2086
  /usr/bin/time -f "maxrss_kb %M" "$M" pretrain $FLAGS $extra > "$OUT/$name.log" 2>&1 \
    || { echo "run $name failed, see $OUT/$name.log" >&2; tail -5 "$OUT/$name.log" >&2; exit 1; }
  ms=$(grep -o "elapsed time per iteration (ms): [0-9.]*" "$OUT/$name.log" | tail -n +2 | awk '{s+=$NF; n++} END {print s/n}')
  rss=$(grep -o "maxrss_kb [0-9]*" "$OUT/$name.log" | awk '{print $2/1024}')
  echo "megatron-rs $name: $(awk -v ms="$ms" 'BEGIN {printf "%.1f", 4*1024/(ms/1000)}') tokens/s ($ms ms/iter), peak RSS ${rss} MiB"
done
if [ -x "$PY" ]; then
  "$PY" scripts/torch_gpt2_step.py --dtype bf16 --threads "$THREADS" --steps $((ITERS - 1))
  "$PY" scripts/torch_gpt2_step.py --dtype fp32 --threads "$THREADS" --steps $((ITERS - 1))
else
  echo "SKIP: no python at $PY for the PyTorch reference"
fi
