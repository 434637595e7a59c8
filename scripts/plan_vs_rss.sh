#!/usr/bin/env bash
# `megatron plan` (predicted process bytes and step time) against the measured peak RSS (GNU
# time) and step time of `megatron pretrain` on the same flags, mock data, 2 iterations (Adam
# state exists after the first, so the second iteration passes every phase with everything
# allocated). Usage: scripts/plan_vs_rss.sh [path/to/megatron] [config-regex, e.g. "^124M-(fp32|tp2)$"]
# LOCK=/work/heavy.lock takes that lock around each pair of runs (shared machines); NICE=19
# runs them niced. Before each pretrain the script waits (up to 5 min) until MemAvailable
# exceeds the plan's prediction + 3 GiB, and skips the config otherwise.
# Prints one row per config; the machine may be shared: say so next to the numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
M=${1:-target/release/megatron}
P=${P:-$M}
FILTER=${2:-}
LOCK=${LOCK:-}
NICE=${NICE:-0}
[ -x "$M" ] || { echo "build $M first (cargo build --release --bin megatron)"; exit 1; }
gpt2="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --vocab-size 50257"
m350="--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --vocab-size 50257"
s256="--seq-length 256"
configs=(
  "124M-fp32       $gpt2 $s256 --micro-batch-size 2 --global-batch-size 2"
  "124M-fp32-mb4   $gpt2 $s256 --micro-batch-size 4 --global-batch-size 4"
  "124M-bf16       $gpt2 $s256 --micro-batch-size 2 --global-batch-size 2 --bf16"
  "124M-tp2        $gpt2 $s256 --micro-batch-size 2 --global-batch-size 2 --tensor-model-parallel-size 2 --nproc 2"
  "124M-pp2        $gpt2 $s256 --micro-batch-size 2 --global-batch-size 4 --pipeline-model-parallel-size 2 --nproc 2"
  "124M-dp2        $gpt2 $s256 --micro-batch-size 2 --global-batch-size 4 --nproc 2"
  "124M-dp2-dist   $gpt2 $s256 --micro-batch-size 2 --global-batch-size 4 --nproc 2 --use-distributed-optimizer"
  "124M-bf16-dist  $gpt2 $s256 --micro-batch-size 2 --global-batch-size 4 --nproc 2 --use-distributed-optimizer --bf16"
  "124M-recompute  $gpt2 $s256 --micro-batch-size 2 --global-batch-size 2 --recompute-activations"
  "124M-full       $gpt2 $s256 --micro-batch-size 2 --global-batch-size 2 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
  "124M-bf16-full  $gpt2 $s256 --micro-batch-size 2 --global-batch-size 2 --bf16 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
  "350M-fp32       $m350 $s256 --micro-batch-size 1 --global-batch-size 1"
  "350M-bf16       $m350 $s256 --micro-batch-size 1 --global-batch-size 1 --bf16"
  "350M-tp2        $m350 $s256 --micro-batch-size 1 --global-batch-size 1 --tensor-model-parallel-size 2 --nproc 2"
  "350M-bf16-pp2   $m350 $s256 --micro-batch-size 1 --global-batch-size 2 --pipeline-model-parallel-size 2 --nproc 2 --bf16"
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common="--mock-data --train-iters 2 --lr 1e-4 --eval-iters 0 --eval-interval 1000 --log-interval 1 --skip-memory-check"
locked() { if [ -n "$LOCK" ]; then flock "$LOCK" "$@"; else "$@"; fi; }
pair() {
  # shellcheck disable=SC2086
  nice -n "$NICE" "$P" plan $flags $common --memory-budget 1T >"$tmp/plan" 2>&1 || return 1
  need=$(( $(sed -n 's/.*process total.*(\([0-9]*\) bytes).*/\1/p' "$tmp/plan") / 1024 + 3 * 1024 * 1024 ))
  for _ in $(seq 60); do
    (( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) > need )) && break
    sleep 5
  done
  (( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) > need )) || { echo "not enough free memory" >"$tmp/err"; return 1; }
  # shellcheck disable=SC2086
  /usr/bin/time -v nice -n "$NICE" "$M" pretrain $flags $common --timing-log-level 1 >"$tmp/out" 2>"$tmp/err"
}
printf "%-15s %9s %9s %7s %8s %8s %6s  %s\n" config plan_GiB rss_GiB ratio plan_s step_s s_ratio "largest transient"
for c in "${configs[@]}"; do
  name=${c%% *}; flags=${c#* }
  [[ -n "$FILTER" && ! "$name" =~ $FILTER ]] && continue
  export M P flags common tmp NICE
  if ! locked bash -c "$(declare -f pair); pair"; then cat "$tmp/plan"; tail -5 "$tmp/err"; continue; fi
  bytes=$(sed -n 's/.*process total.*(\([0-9]*\) bytes).*/\1/p' "$tmp/plan")
  pstep=$(sed -n 's/predicted step time: \([0-9.]*\) s.*/\1/p' "$tmp/plan")
  phase=$(awk '/^ +[0-9]+ +[0-9]+ +[0-9]+ / {sub(/.*  /, ""); print; exit}' "$tmp/plan")
  rss=$(awk '/Maximum resident/ {print $6 * 1024}' "$tmp/err")
  # Second iteration's elapsed time per iteration (ms) from the console line.
  step=$(grep -o 'elapsed time per iteration (ms): [0-9.]*' "$tmp/out" | tail -1 | awk '{print $NF / 1000}')
  awk -v n="$name" -v p="$bytes" -v r="$rss" -v ps="$pstep" -v s="$step" -v ph="$phase" \
    'BEGIN {printf "%-15s %9.3f %9.3f %7.3f %8.2f %8.2f %6.2f  %s\n", n, p/2^30, r/2^30, p/r, ps, s, ps/s, ph}'
  # The step-time terms of the plan and, with several ranks, where each rank's time went.
  if [ -n "${LOGDIR:-}" ]; then
    mkdir -p "$LOGDIR"; cp "$tmp/plan" "$LOGDIR/$name.plan"; cp "$tmp/out" "$LOGDIR/$name.out"
  fi
  sed -n 's/^predicted step time: [0-9.]* s (\(.*\)) at \(.*\)/    plan: \1; \2/p' "$tmp/plan"
  grep -E '^rank [0-9]+:|^    (all_reduce|send|recv|reduce_scatter|all_gather) ' "$tmp/out" | sed 's/^/    /' || true
done
