#!/usr/bin/env bash
# MPI fault handling, RUNS times each (every run must pass):
#  1. a rank of a tp2 training job killed with SIGKILL mid-run: the job ends with an error naming
#     that rank;
#  2. a rank that stops calling collectives (plugins/comm-mpi/examples/skip_collective.rs, built
#     with `cargo build -p megatron-comm-mpi --features mpi --examples`): the other ranks report
#     the group, the collective, its sequence number and the missing rank within the timeout
#     (5 s here) and the job ends with MPI_Abort.
# Usage: scripts/mpi_faults.sh [megatron (--features mpi)] [runs] [skip_collective example]
set -uo pipefail
B=${1:-target/debug/megatron}; RUNS=${2:-3}; SKIPBIN=${3:-target/debug/examples/skip_collective}
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 0; }
MPIRUN="mpirun --oversubscribe"; [ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
F="--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16 \
 --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --mock-data --vocab-size 128 --train-iters 100000 \
 --log-interval 1000 --tensor-model-parallel-size 2 --distributed-timeout-minutes 1"
pass=0; fail=0
for i in $(seq "$RUNS"); do
  start=$(date +%s)
  timeout 120 $MPIRUN -np 2 "$B" pretrain $F >"$T/out" 2>&1 &
  job=$!
  sleep 3
  # A rank of this job: the binary exactly as launched (never another megatron on the machine).
  victim=$(pgrep -f "^$B pretrain" | tail -1)
  [ -z "$victim" ] && victim=$(pgrep -f "^[^ ]*megatron-mpi pretrain" | tail -1)
  kill -9 "$victim" 2>/dev/null
  wait $job; rc=$?; secs=$(( $(date +%s) - start ))
  if [ $rc != 0 ] && [ $rc != 124 ] && grep -qE "rank [0-9]+.*(signal 9|Killed|failed|never arrived)|(signal 9|Killed).*rank [0-9]+|process rank [0-9]+" "$T/out"; then
    echo "run $i: job ended (rc $rc) after ${secs}s: $(grep -E "process rank|failed|never arrived|signal 9" "$T/out" | head -2 | tr -s " " | tr "\n" " ")"; pass=$((pass+1))
  else
    echo "run $i: NOT detected (rc $rc, ${secs}s)"; tail -5 "$T/out"; fail=$((fail+1))
  fi
done
if [ -x "$SKIPBIN" ]; then
  for i in $(seq "$RUNS"); do
    start=$(date +%s.%N)
    timeout 120 $MPIRUN -np 3 "$SKIPBIN" 1 3 5 >"$T/out" 2>&1; rc=$?
    secs=$(python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$start" "$(date +%s.%N)")
    if [ $rc != 0 ] && [ $rc != 124 ] && grep -q "all_reduce.*#3 on group \`world\`.*ranks \[1\] never arrived" "$T/out"; then
      echo "skip run $i: job ended (rc $rc) after ${secs}s: $(grep -m1 "never arrived" "$T/out" | cut -c1-200)"; pass=$((pass+1))
    else
      echo "skip run $i: NOT detected (rc $rc, ${secs}s)"; tail -5 "$T/out"; fail=$((fail+1))
    fi
  done
else
  echo "SKIP the skipped-collective drill: $SKIPBIN not built (cargo build -p megatron-comm-mpi --features mpi --examples)"
fi
echo "mpi faults: $pass passed, $fail failed"
[ "$fail" = 0 ]
