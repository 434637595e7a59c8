#!/usr/bin/env bash
# MPI fault handling, RUNS times each (every run must pass):
#  1. a rank of a tp2 training job killed with SIGKILL mid-run: the job ends with an error naming
#     that rank;
#  2. a rank that stops calling collectives (plugins/comm-mpi/examples/skip_collective.rs, built
#     with `cargo build -p megatron-comm-mpi --features mpi --examples`): the other ranks report
#     the group, the collective, its sequence number and the missing rank within the timeout
#     (5 s here) and the job ends with MPI_Abort.
#  3. `megatron serve --tensor-model-parallel-size 2` under mpirun -np 2: rank 1 (a follower),
#     then rank 0 (the server) killed with SIGKILL: the job ends, mpirun names the rank.
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
# 3. `megatron serve` at tp2 under mpirun (issue 21): the follower (rank 1), then rank 0 (the
#    HTTP server), killed with SIGKILL: the whole job must end (no rank left waiting) and mpirun
#    must name the rank.
if "$B" serve --help >/dev/null 2>&1; then
  "$B" pretrain --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 \
    --micro-batch-size 2 --global-batch-size 4 --lr 3e-3 --mock-data --vocab-size 100 --train-iters 2 \
    --log-interval 10 --eval-interval 100 --eval-iters 1 --save "$T/ckpt" --save-interval 2 >"$T/pre" 2>&1 \
    || { cat "$T/pre"; exit 1; }
  for victim in 1 0; do
    timeout 120 $MPIRUN -np 2 "$B" serve --load "$T/ckpt" --port 0 --quiet --tensor-model-parallel-size 2 >"$T/out" 2>&1 &
    job=$!
    # The two processes print in any order: wait for the server's banner and the victim's pid.
    pid=""
    for _ in $(seq 300); do
      pid=$(grep -aoE "rank $victim (of 2 )?\(pid [0-9]+\)" "$T/out" | grep -oE "[0-9]+\)" | tr -d ")") || true
      grep -aq "on http://" "$T/out" && [ -n "$pid" ] && break; sleep 0.1
    done
    start=$(date +%s)
    [ -n "$pid" ] && kill -9 "$pid"
    wait $job; rc=$?; secs=$(( $(date +%s) - start ))
    if [ -n "$pid" ] && [ $rc != 0 ] && [ $rc != 124 ] && grep -aq "process rank $victim .*signal 9" "$T/out"; then
      echo "serve, rank $victim killed: job ended (rc $rc) after ${secs}s: $(grep -a "process rank" "$T/out" | tr -s " ")"
      pass=$((pass+1))
    else
      echo "serve, rank $victim killed: NOT detected (pid '$pid', rc $rc, ${secs}s)"; tail -5 "$T/out"; fail=$((fail+1))
    fi
  done
else
  echo "SKIP the serving drill: $B has no \`serve\` command"
fi
echo "mpi faults: $pass passed, $fail failed"
[ "$fail" = 0 ]
