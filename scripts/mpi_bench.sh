#!/usr/bin/env bash
# MPI vs threads on this machine (issue 12 item 4), release build with --features mpi:
#   scripts/mpi_bench.sh comm [megatron] [max bytes]  `megatron bench comm` at 2 and 4 ranks,
#       `--nproc N` (threads, `local`) then `mpirun -np N` (`mpi`), 4 KiB .. 256 MiB, and a table
#       of MPI/threads time ratios per op and size (the same run);
#   scripts/mpi_bench.sh step [megatron] [iters]  GPT-2 124M (12/768/12, seq 1024, micro batch 1)
#       at tp2: `--nproc 2` vs `mpirun -np 2`, one thread per rank, mean step time after the first.
# Run under `flock /work/heavy.lock` on a shared machine; numbers are only comparable within a run.
set -euo pipefail
WHAT=${1:?usage: scripts/mpi_bench.sh comm|step [megatron] [arg]}
B=${2:-target/release/megatron}
MPIRUN=${MPIRUN:-mpirun}
if "${MPIRUN%% *}" --version 2>&1 | grep -q "Open MPI"; then
  MPIRUN="$MPIRUN --oversubscribe"; [ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
fi
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
case "$WHAT" in
comm)
  MAX=${3:-256M}
  for n in 2 4; do
    "$B" bench comm --nproc $n --distributed-backend local --max-bytes "$MAX" --iters 10 --warmup 1 | tee "$T/thr$n"
    $MPIRUN -np $n "$B" bench comm --max-bytes "$MAX" --iters 10 --warmup 1 | tee "$T/mpi$n"
  done
  python3 - "$T" <<'PY'
import sys, os
def rows(p):
    out = {}
    for l in open(p):
        if l.startswith("#") or not l.strip(): continue
        f = l.split()
        out[(f[0], f[1] + " " + f[2])] = (float(f[4]), float(f[6]))  # time us, busbw
    return out
print("\n| op | size | 2 ranks threads us (busbw GB/s) | 2 ranks MPI us (busbw) | MPI/threads | 4 ranks threads us (busbw) | 4 ranks MPI us (busbw) | MPI/threads |")
print("|---|---|---|---|---|---|---|---|")
t2, m2, t4, m4 = (rows(os.path.join(sys.argv[1], f)) for f in ("thr2", "mpi2", "thr4", "mpi4"))
for k in t2:
    cells = []
    for t, m in ((t2, m2), (t4, m4)):
        a, b = t[k], m[k]
        cells += [f"{a[0]:.0f} ({a[1]:.2f})", f"{b[0]:.0f} ({b[1]:.2f})", f"{b[0]/a[0]:.2f}x"]
    print(f"| {k[0]} | {k[1]} | " + " | ".join(cells) + " |")
PY
  ;;
step)
  IT=${3:-4}
  F="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 \
   --micro-batch-size 1 --global-batch-size 1 --vocab-size 50257 --mock-data --lr 1e-4 --train-iters $IT \
   --log-interval 1 --eval-iters 0 --eval-interval 1000000 --tensor-model-parallel-size 2 --seed 1"
  "$B" pretrain $F --nproc 2 --threads 2 --distributed-backend local >"$T/thr.log" 2>&1 || { cat "$T/thr.log"; exit 1; }
  $MPIRUN -np 2 "$B" pretrain $F --threads 1 >"$T/mpi.log" 2>&1 || { cat "$T/mpi.log"; exit 1; }
  grep -h "MPI world\|threads" "$T/mpi.log" | head -2
  python3 - "$T/thr.log" "$T/mpi.log" <<'PY'
import re, sys
def steps(p):
    return [float(m.group(1)) for m in re.finditer(r"elapsed time per iteration \(ms\): ([0-9.]+)", open(p).read())]
t, m = steps(sys.argv[1]), steps(sys.argv[2])
loss = lambda p: re.findall(r"lm loss: ([0-9.E+-]+)", open(p).read())
assert len(t) >= 2 and len(m) >= 2, (t, m)
tt, mm = sum(t[1:]) / len(t[1:]), sum(m[1:]) / len(m[1:])
print(f"GPT-2 124M tp2, micro batch 1 x seq 1024, steps 2..{len(t)}: --nproc 2 threads {tt:.0f} ms/step, "
      f"mpirun -np 2 {mm:.0f} ms/step, MPI/threads {mm/tt:.3f}")
print("lm losses threads:", loss(sys.argv[1]), " MPI:", loss(sys.argv[2]))
PY
  ;;
*) echo "usage: scripts/mpi_bench.sh comm|step [megatron] [arg]"; exit 2 ;;
esac
