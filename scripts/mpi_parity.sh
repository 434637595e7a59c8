#!/usr/bin/env bash
# MPI parity: the tiny GPT for 20 iterations under mpirun -np N gives bit-identical per-iteration
# losses and grad norms (JSONL metrics, shortest round-trip f64) to the same layout with ranks as
# threads (--nproc N), and prints the max relative difference to the single-rank run.
# Usage: scripts/mpi_parity.sh [path/to/megatron built with --features mpi]
set -euo pipefail
B=${1:-target/debug/megatron}
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 0; }
MPIRUN="mpirun --oversubscribe"; [ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
F="--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16 \
 --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 3 \
 --mock-data --vocab-size 128 --make-vocab-size-divisible-by 64 --seed 7 --log-interval 10 --eval-interval 20 \
 --eval-iters 1 --hidden-dropout 0 --attention-dropout 0 --weight-decay 0.1 --adam-beta2 0.95 --train-iters 20"
series() { grep -E '"tag":"(lm loss|grad-norm)"' "$1"; }
"$B" pretrain $F --metrics-jsonl "$T/ref.jsonl" >"$T/ref.log" 2>&1
pass=0; fail=0
for layout in "2 1 1" "1 2 1" "1 1 2" "2 2 1" "2 2 2"; do
  set -- $layout; tp=$1 pp=$2 dp=$3 n=$((tp*pp*dp)); L="--tensor-model-parallel-size $tp --pipeline-model-parallel-size $pp"
  "$B" pretrain $F $L --nproc $n --distributed-backend local --metrics-jsonl "$T/thr$n$tp$pp.jsonl" >"$T/thr.log" 2>&1
  $MPIRUN -np $n "$B" pretrain $F $L --metrics-jsonl "$T/mpi$n$tp$pp.jsonl" >"$T/mpi.log" 2>&1 || { cat "$T/mpi.log"; exit 1; }
  rel=$(python3 - "$T/ref.jsonl" "$T/mpi$n$tp$pp.jsonl" <<'PY'
import json,sys
def s(p): return {(d["tag"],d["iteration"]):d["value"] for d in map(json.loads,open(p)) if d["tag"] in("lm loss","grad-norm")}
a,b=s(sys.argv[1]),s(sys.argv[2]); assert a.keys()==b.keys() and len(a)==40
print("%.2e"%max(abs(a[k]-b[k])/abs(a[k]) for k in a))
PY
)
  if diff <(series "$T/thr$n$tp$pp.jsonl") <(series "$T/mpi$n$tp$pp.jsonl") >/dev/null && [ "$(series "$T/mpi$n$tp$pp.jsonl" | wc -l)" = 40 ]; then
    echo "tp$tp pp$pp dp$dp (mpirun -np $n): 20 losses + 20 grad norms bit-identical to --nproc $n; max rel diff vs 1 rank $rel"; pass=$((pass+1))
  else
    echo "tp$tp pp$pp dp$dp (mpirun -np $n): DIFFERS from --nproc $n"; fail=$((fail+1))
  fi
done
echo "mpi parity: $pass passed, $fail failed"
[ "$fail" = 0 ]
