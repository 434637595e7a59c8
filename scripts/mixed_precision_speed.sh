#!/usr/bin/env bash
# GPT-2 124M shape (12 layers, 768 hidden, 12 heads, seq 1024, micro batch 4, vocab 50257, mock
# data): training tokens/s and peak RSS of our fp32, --bf16 (and --fp16) runs next to PyTorch
# eager (bf16 autocast, fp32) on the same threads, measured in ONE run, then the ratios.
#   M=target/release/megatron THREADS=2 ITERS=4 flock /work/heavy.lock bash scripts/mixed_precision_speed.sh
# Environment (defaults): M (target/release/megatron), THREADS (2), ITERS (4, >= 2: the first
# iteration is warm-up), RUNS ("fp32 bf16 fp16": which of ours), TORCH ("bf16 fp32": which
# PyTorch runs; empty for none), PYTHON (/work/venv/bin/python), OUT (a temp dir).
# tokens/s: ours, the mean over the iterations after the first (the log line's elapsed time per
# iteration); PyTorch, ITERS-1 timed steps after one warm-up step.
set -euo pipefail
cd "$(dirname "$0")/.."
M="${M:-target/release/megatron}"
THREADS="${THREADS:-2}"
ITERS="${ITERS:-4}"
RUNS="${RUNS:-fp32 bf16 fp16}"
TORCH="${TORCH-bf16 fp32}"
PY="${PYTHON:-/work/venv/bin/python}"
OUT="${OUT:-$(mktemp -d /tmp/mixed_precision_speed.XXXXXX)}"
[ "$ITERS" -ge 2 ] || { echo "ITERS must be >= 2 (the first iteration is warm-up)" >&2; exit 2; }
FLAGS="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 \
  --micro-batch-size 4 --global-batch-size 4 --train-iters $ITERS --lr 1e-4 --mock-data --vocab-size 50257 \
  --hidden-dropout 0 --attention-dropout 0 --log-interval 1 --eval-interval 1000000 --eval-iters 0 \
  --threads $THREADS --skip-memory-check"
mkdir -p "$OUT"
echo "outputs in $OUT; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $THREADS threads, $ITERS iterations"
declare -A TOK RSS
for name in $RUNS; do
  case $name in
    fp32) extra="" ;;
    bf16) extra="--bf16" ;;
    fp16) extra="--fp16 --initial-loss-scale 65536" ;;
    *) echo "unknown run $name (fp32, bf16, fp16)" >&2; exit 2 ;;
  esac
  # shellcheck disable=SC2086
  /usr/bin/time -f "maxrss_kb %M" "$M" pretrain $FLAGS $extra > "$OUT/$name.log" 2>&1 \
    || { echo "run $name failed, see $OUT/$name.log" >&2; tail -5 "$OUT/$name.log" >&2; exit 1; }
  ms=$(grep -o "elapsed time per iteration (ms): [0-9.]*" "$OUT/$name.log" | tail -n +2 | awk '{s+=$NF; n++} END {print s/n}')
  TOK[ours-$name]=$(awk -v ms="$ms" 'BEGIN {printf "%.1f", 4*1024/(ms/1000)}')
  RSS[ours-$name]=$(grep -o "maxrss_kb [0-9]*" "$OUT/$name.log" | awk '{printf "%.0f", $2/1024}')
  echo "megatron-rs $name: ${TOK[ours-$name]} tokens/s ($ms ms/iter), peak RSS ${RSS[ours-$name]} MiB"
done
if [ -n "$TORCH" ] && [ ! -x "$PY" ]; then
  echo "SKIP: no python at $PY for the PyTorch reference"; TORCH=""
fi
for dt in $TORCH; do
  line=$("$PY" scripts/torch_gpt2_step.py --dtype "$dt" --threads "$THREADS" --steps $((ITERS - 1)))
  echo "$line"
  TOK[torch-$dt]=$(echo "$line" | grep -o "[0-9.]* tokens/s" | awk '{print $1}')
  RSS[torch-$dt]=$(echo "$line" | grep -o "peak RSS [0-9]*" | awk '{print $3}')
done
echo
echo "| run | tokens/s | peak RSS (MiB) |"
echo "|---|---|---|"
for key in ours-fp32 ours-bf16 ours-fp16 torch-bf16 torch-fp32; do
  [ -n "${TOK[$key]:-}" ] && echo "| $key | ${TOK[$key]} | ${RSS[$key]} |"
done
ratio() { [ -n "${TOK[$1]:-}" ] && [ -n "${TOK[$2]:-}" ] && awk -v a="${TOK[$1]}" -v b="${TOK[$2]}" -v l="$3" 'BEGIN {printf "%s: %.2fx\n", l, a/b}'; return 0; }
echo
ratio ours-bf16 ours-fp32 "ours bf16 / ours fp32 (goal 1.6x)"
ratio ours-bf16 torch-bf16 "ours bf16 / torch eager bf16 (goal 1.35x)"
ratio ours-fp32 torch-fp32 "ours fp32 / torch eager fp32"
ratio ours-fp16 ours-fp32 "ours fp16 / ours fp32"
