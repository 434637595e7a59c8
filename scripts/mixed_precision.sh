#!/usr/bin/env bash
# Mixed-precision measurements of issue 11 on the core issue's tiny-Shakespeare config (4 layers,
# 256 hidden, 4 heads, seq 256, micro batch 8, GPT-2 vocab, 200 iterations):
#   1. fp32 vs --bf16 vs --fp16 losses side by side, and the mean of iterations 191-200;
#   2. an fp16 run with a huge --initial-loss-scale: the scale backing off and the skipped
#      iterations in the log lines, then normal training.
#   M=target/release/megatron ITERS=200 flock /work/heavy.lock bash scripts/mixed_precision.sh
# Losses do not depend on the build profile (no fast-math; same kernels), so a dev binary gives
# the same curves; only its speed differs. Needs ../shared/data.
set -euo pipefail
cd "$(dirname "$0")/.."
M="${M:-target/release/megatron}"
ITERS="${ITERS:-200}"
OVERFLOW_ITERS="${OVERFLOW_ITERS:-80}"
DATA="${DATA:-../shared/data}"
OUT="${OUT:-$(mktemp -d /tmp/mixed_precision.XXXXXX)}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
prefix="$DATA/tinyshakespeare_gpt2_text_document"
[ -n "${DATA_FLAGS:-}" ] || [ -f "$prefix.idx" ] || { echo "SKIP: $prefix.idx is absent (reference data lives in ../shared/data)"; exit 0; }
[ -x "$M" ] || { echo "no binary at $M: cargo build --release first" >&2; exit 1; }
# MODEL/DATA_FLAGS override the config (e.g. a smaller model on mock data when the machine is busy).
MODEL="${MODEL:---num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 --max-position-embeddings 256 --micro-batch-size 8 --global-batch-size 8}"
DATA_FLAGS="${DATA_FLAGS:---data-path $prefix --split 98,2,0 --tokenizer-type GPT2BPETokenizer --vocab-file $DATA/gpt2/vocab.json --merge-file $DATA/gpt2/merges.txt}"
FLAGS="$MODEL --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine \
  --lr-warmup-iters 20 --weight-decay 0.1 --clip-grad 1.0 --seed 1234 --log-interval 1 \
  --eval-interval 1000000 --eval-iters 1 $DATA_FLAGS"

run() { # name extra-flags...
  local name=$1; shift
  rm -f "$OUT/$name.jsonl"
  local t0=$SECONDS
  # shellcheck disable=SC2086
  "$M" pretrain $FLAGS "$@" --metrics-jsonl "$OUT/$name.jsonl" > "$OUT/$name.log" 2>&1 \
    || { echo "run $name failed, see $OUT/$name.log" >&2; tail -5 "$OUT/$name.log" >&2; exit 1; }
  echo "run $name: $((SECONDS - t0)) s"
}
echo "outputs in $OUT; $ITERS iterations per run; $(nproc) cores (shared machine)"
run fp32 --train-iters "$ITERS"
run bf16 --train-iters "$ITERS" --bf16
run fp16 --train-iters "$ITERS" --fp16
# Megatron's default initial scale 2^32 skips the first ~10 updates (and their LR steps); 2^16
# starts below the overflow threshold, so its curve lines up with fp32 iteration for iteration.
run fp16_s16 --train-iters "$ITERS" --fp16 --initial-loss-scale 65536
run fp16_overflow --train-iters "$OVERFLOW_ITERS" --fp16 --initial-loss-scale 1099511627776 --loss-scale-window 20

"$PY" - "$OUT" "$ITERS" <<'PYEOF'
import json, sys
out, iters = sys.argv[1], int(sys.argv[2])
def losses(name):
    d = {}
    for line in open(f"{out}/{name}.jsonl"):
        r = json.loads(line)
        if r.get("tag") == "lm loss":
            d[r["iteration"]] = r["value"]
    return d
runs = {n: losses(n) for n in ["fp32", "bf16", "fp16", "fp16_s16"]}
print("iteration " + " ".join(f"{n:>14}" for n in runs))
for it in [1, 10, 25, 50, 100, 150, 200]:
    if it <= iters:
        print(f"{it:9d} " + " ".join(f"{runs[n].get(it, float('nan')):14.4f}" for n in runs))
lo = max(1, iters - 9)
base = None
for n, d in runs.items():
    m = sum(d[i] for i in range(lo, iters + 1)) / (iters - lo + 1)
    base = base if base is not None else m
    print(f"mean {lo}-{iters} {n:>14}: {m:.4f} ({100 * (m - base) / base:+.2f}% vs fp32)")
PYEOF
echo "== skipped iterations: fp16 $(grep -c 'skipped iterations:   1' "$OUT/fp16.log"), fp16_s16 $(grep -c 'skipped iterations:   1' "$OUT/fp16_s16.log")"
echo "== fp16 with --initial-loss-scale 2^40: the log lines (loss scale, skipped iterations)"
grep "iteration" "$OUT/fp16_overflow.log" | sed -E 's/^.*(iteration +[0-9]+\/)/\1/; s/consumed samples.*learning rate/learning rate/; s/ global batch size: +[0-9]+ \|//' | head -50 || true
