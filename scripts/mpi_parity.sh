#!/usr/bin/env bash
# MPI parity: the tiny GPT for 20 iterations under mpirun -np N gives bit-identical per-iteration
# losses and grad norms (JSONL metrics, shortest round-trip f64) to the same layout with ranks as
# threads (--nproc N), and prints the max relative difference to the single-rank run.
# MoE cases (issue 17, the all_to_all token dispatcher over MPI): 4 experts, top-2, ep2 (np 2) and
# ep2 tp2 (np 4) with --moe-token-dispatcher-type alltoall: bit-identical to --nproc N and within
# 1e-5 relative of the single-rank MoE run. They need the MoE plugin: linked in (--features moe)
# or the library in $MOE_PLUGIN (default target/debug/libmegatron_moe.so, built by
# `cargo build -p megatron-moe`); without either they are skipped with a message.
# Usage: scripts/mpi_parity.sh [path/to/megatron built with --features mpi]
# MPIRUN overrides the launcher (e.g. MPIRUN=mpirun.mpich for an MPICH build, docs/mpi.md).
set -euo pipefail
B=${1:-target/debug/megatron}
MPIRUN=${MPIRUN:-mpirun}
command -v "${MPIRUN%% *}" >/dev/null || { echo "SKIP: $MPIRUN not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 0; }
# Open MPI refuses more ranks than cores and root without these; MPICH's Hydra needs neither.
if "${MPIRUN%% *}" --version 2>&1 | grep -q "Open MPI"; then
  MPIRUN="$MPIRUN --oversubscribe"; [ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
fi
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
F="--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16 \
 --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 3 \
 --mock-data --vocab-size 128 --make-vocab-size-divisible-by 64 --seed 7 --log-interval 10 --eval-interval 20 \
 --eval-iters 1 --hidden-dropout 0 --attention-dropout 0 --weight-decay 0.1 --adam-beta2 0.95 --train-iters 20"
MOE="--num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 1e-2 --moe-token-dispatcher-type alltoall"
series() { grep -E '"tag":"(lm loss|grad-norm)"' "$1"; }
# max relative difference of the 20 losses + 20 grad norms of two runs
maxrel() {
  python3 - "$1" "$2" <<'PY'
import json,sys
def s(p): return {(d["tag"],d["iteration"]):d["value"] for d in map(json.loads,open(p)) if d["tag"] in("lm loss","grad-norm")}
a,b=s(sys.argv[1]),s(sys.argv[2]); assert a.keys()==b.keys() and len(a)==40
print("%.2e"%max(abs(a[k]-b[k])/abs(a[k]) for k in a))
PY
}
pass=0; fail=0
# case NAME NPROC REF_JSONL BOUND PRE_FLAGS FLAGS...: --nproc N vs mpirun -np N, and vs the reference.
case_() {
  local name=$1 n=$2 ref=$3 bound=$4 pre=$5; shift 5
  rm -f "$T/thr.jsonl" "$T/mpi.jsonl" # --metrics-jsonl appends
  "$B" $pre pretrain $F "$@" --nproc "$n" --distributed-backend local --metrics-jsonl "$T/thr.jsonl" >"$T/thr.log" 2>&1 \
    || { cat "$T/thr.log"; exit 1; }
  $MPIRUN -np "$n" "$B" $pre pretrain $F "$@" --metrics-jsonl "$T/mpi.jsonl" >"$T/mpi.log" 2>&1 || { cat "$T/mpi.log"; exit 1; }
  local rel; rel=$(maxrel "$ref" "$T/mpi.jsonl")
  if diff <(series "$T/thr.jsonl") <(series "$T/mpi.jsonl") >/dev/null && [ "$(series "$T/mpi.jsonl" | wc -l)" = 40 ] \
     && python3 -c "import sys; sys.exit(float(sys.argv[1]) > float(sys.argv[2]))" "$rel" "$bound"; then
    echo "$name (mpirun -np $n): 20 losses + 20 grad norms bit-identical to --nproc $n; max rel diff vs 1 rank $rel"; pass=$((pass+1))
  else
    echo "$name (mpirun -np $n): DIFFERS from --nproc $n or exceeds $bound vs 1 rank (max rel $rel)"; fail=$((fail+1))
  fi
}
"$B" pretrain $F --metrics-jsonl "$T/ref.jsonl" >"$T/ref.log" 2>&1
for layout in "2 1 1" "1 2 1" "1 1 2" "2 2 1" "2 2 2"; do
  set -- $layout; tp=$1 pp=$2 dp=$3
  case_ "tp$tp pp$pp dp$dp" $((tp*pp*dp)) "$T/ref.jsonl" 1e-6 "" \
    --tensor-model-parallel-size "$tp" --pipeline-model-parallel-size "$pp"
done
# MoE: the plugin linked in, or loaded from $MOE_PLUGIN.
PRE=""
if ! "$B" list 2>/dev/null | grep -qE "^mlp +moe "; then
  LIB=${MOE_PLUGIN:-target/debug/libmegatron_moe.so}
  if [ -f "$LIB" ]; then PRE="--plugin $LIB"; else PRE=none; fi
fi
if [ "$PRE" = none ]; then
  echo "SKIP the MoE cases: $B has no MoE plugin and $LIB is missing (cargo build -p megatron-moe, or --features mpi,moe)"
else
  "$B" $PRE pretrain $F $MOE --metrics-jsonl "$T/moe_ref.jsonl" >"$T/moe_ref.log" 2>&1 || { cat "$T/moe_ref.log"; exit 1; }
  case_ "MoE alltoall ep2" 2 "$T/moe_ref.jsonl" 1e-5 "$PRE" $MOE --expert-model-parallel-size 2
  case_ "MoE alltoall ep2 tp2" 4 "$T/moe_ref.jsonl" 1e-5 "$PRE" $MOE --expert-model-parallel-size 2 \
    --tensor-model-parallel-size 2
fi
echo "mpi parity: $pass passed, $fail failed"
[ "$fail" = 0 ]
