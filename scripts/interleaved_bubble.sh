#!/bin/bash
# Pipeline bubble of the interleaved 1F1B schedule vs plain 1F1B at pp2 and pp4 with the same
# 8 microbatches (issue 13, item 4), from `--timing-log-level 1`: per rank, bubble = (wall time
# - compute) / compute, where compute is the time outside communicator calls (the waiting in
# `recv` on the pipeline groups is the bubble; see src/train/comm_timing.rs). Printed next to
# Megatron's formula (pp-1)/(v*m).
#
# Two modes (docs/interleaved-pipeline.md):
# - real compute (default): ranks are threads with one backend thread each, so pp4 needs 4
#   idle cores to be meaningful;
#   flock /work/heavy.lock scripts/interleaved_bubble.sh
# - PROBE_MS=N: every rank also sleeps N ms per microbatch forward and 2N per backward (split
#   over its chunks; hidden flag --pipeline-probe-compute-ms) on a small model, so equal stages
#   dominate and no rank needs a core of its own: the schedule's bubble on any machine;
#   PROBE_MS=100 ITERS=3 nice -n -10 scripts/interleaved_bubble.sh (nice: wake-ups on a busy machine)
set -e
B=${MEGATRON:-target/release/megatron}
ITERS=${ITERS:-4}
if [ -n "$PROBE_MS" ]; then
  HIDDEN=${HIDDEN:-64}; SEQ=${SEQ:-32}; PROBE="--pipeline-probe-compute-ms $PROBE_MS"
else
  HIDDEN=${HIDDEN:-256}; SEQ=${SEQ:-256}; PROBE=""
fi
F="pretrain --num-layers 8 --hidden-size $HIDDEN --num-attention-heads 8 --seq-length $SEQ
   --max-position-embeddings $SEQ --micro-batch-size 1 --global-batch-size 8 --train-iters $ITERS --lr 1e-4
   --mock-data --vocab-size 1024 --eval-iters 0 --eval-interval 1000 --log-interval 1000 --threads 1
   --hidden-dropout 0 --attention-dropout 0 --timing-log-level 1 $PROBE"
for pp in ${PPS:-2 4}; do
  for vp in 1 2; do
    extra="--nproc $pp --pipeline-model-parallel-size $pp"
    [ "$vp" -gt 1 ] && extra="$extra --num-virtual-stages-per-pipeline-rank $vp"
    out=$($B $F $extra 2>&1)
    echo "$out" | grep -E "rror" && exit 1
    echo "$out" | awk -v pp=$pp -v vp=$vp '
      /^rank [0-9]+: .* s\/iteration/ {
        wall = $3; for (i = 1; i <= NF; i++) if ($i == "compute") comp = $(i + 1);
        b = (wall - comp) / comp; sum += b; n++;
        printf "  pp%d vp%d rank %s wall %.3f s/it compute %.3f s/it bubble %.3f\n", pp, vp, $2, wall, comp, b }
      END { printf "pp%d vp%d m8: measured bubble (mean over ranks) %.3f, formula (pp-1)/(v*m) = %.3f\n",
            pp, vp, sum / n, (pp - 1) / (vp * 8) }'
  done
done
