#!/usr/bin/env bash
# The determinism table of issue 10 on the core issue's tiny-Shakespeare config (4 layers, 256
# hidden, 4 heads, seq 256, micro batch 8, GPT-2 vocab, default dropout, --log-interval 1):
#   run-to-run with a busy competitor process, --threads 1 / 2 / 4, ITERS/2 + save + resume to
#   ITERS vs ITERS straight, and tokens/s before (BEFORE binary, e.g. main) and after (AFTER).
# Losses and grad norms are compared bit for bit (full-precision values from --metrics-jsonl).
#   BEFORE=/tmp/megatron-main AFTER=target/release/megatron ITERS=40 \
#     flock /work/heavy.lock bash scripts/determinism_table.sh
# BEFORE is optional (the "before" rows are skipped without it). Needs ../shared/data.
set -euo pipefail
cd "$(dirname "$0")/.."
AFTER="${AFTER:-target/release/megatron}"
BEFORE="${BEFORE:-}"
ITERS="${ITERS:-40}"
DATA="${DATA:-../shared/data}"
OUT="${OUT:-$(mktemp -d /tmp/determinism_table.XXXXXX)}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
prefix="$DATA/tinyshakespeare_gpt2_text_document"
[ -f "$prefix.idx" ] || { echo "SKIP: $prefix.idx is absent (reference data lives in ../shared/data)"; exit 0; }
[ -x "$AFTER" ] || { echo "no AFTER binary at $AFTER: cargo build --release first" >&2; exit 1; }
FLAGS="--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 --max-position-embeddings 256 \
  --micro-batch-size 8 --global-batch-size 8 --train-iters $ITERS --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine \
  --lr-warmup-iters 3 --weight-decay 0.1 --clip-grad 1.0 --seed 1234 --log-interval 1 \
  --eval-interval 1000000 --eval-iters 1 --data-path $prefix --split 98,2,0 \
  --tokenizer-type GPT2BPETokenizer --vocab-file $DATA/gpt2/vocab.json --merge-file $DATA/gpt2/merges.txt"

run() { # name binary extra-flags...
  local name=$1 bin=$2; shift 2
  rm -f "$OUT/$name.jsonl"
  # shellcheck disable=SC2086
  "$bin" pretrain $FLAGS "$@" --metrics-jsonl "$OUT/$name.jsonl" > "$OUT/$name.log" 2>&1 \
    || { echo "run $name failed, see $OUT/$name.log" >&2; tail -5 "$OUT/$name.log" >&2; exit 1; }
}
busy_start() { ( while :; do :; done ) & BUSY=$!; }
busy_stop() { kill "$BUSY"; wait "$BUSY" 2>/dev/null || true; }

echo "outputs in $OUT; $ITERS iterations per run; $(nproc) cores"
if [ -n "$BEFORE" ]; then
  run before_quiet "$BEFORE"
  busy_start; run before_busy "$BEFORE"; busy_stop
fi
run after_quiet "$AFTER"
busy_start; run after_busy "$AFTER"; busy_stop
run after_t1 "$AFTER" --threads 1
run after_t4 "$AFTER" --threads 4
half=$((ITERS / 2))
rm -rf "$OUT/ckpt"
run after_first "$AFTER" --exit-interval "$half" --save "$OUT/ckpt" --save-interval "$half"
run after_resumed "$AFTER" --load "$OUT/ckpt" --save "$OUT/ckpt" --save-interval "$ITERS"
cat "$OUT/after_first.jsonl" "$OUT/after_resumed.jsonl" > "$OUT/after_resume.jsonl"

"$PY" - "$OUT" "$ITERS" "${BEFORE:+1}" <<'PYEOF'
import json, statistics, sys
import os
out, iters, have_before = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
cores = os.cpu_count()
def load(name):
    d = {}
    for line in open(f"{out}/{name}.jsonl"):
        r = json.loads(line)
        d.setdefault(r["tag"], {})[r["iteration"]] = r["value"]
    return d
def compare(a, b):
    A, B = load(a), load(b)
    for it in range(1, iters + 1):
        for tag in ("lm loss", "grad-norm"):
            x, y = A[tag].get(it), B[tag].get(it)
            if x is None or y is None:
                return f"missing iteration {it}"
            if x != y:
                return f"DIFFERS from iteration {it} ({tag} {x!r} vs {y!r})"
    return f"bit-identical, {iters} iterations (lm loss and grad norm)"
def tps(name):
    # From the console lines (`elapsed time per iteration (ms)` at --log-interval 1): both
    # binaries print them, whatever their TensorBoard/JSONL timer flags.
    import re
    tokens = 8 * 256  # global batch x seq length of FLAGS
    ms = [float(m.group(2)) for m in (re.search(r"iteration\s+(\d+)/.*?elapsed time per iteration \(ms\): ([0-9.]+)", l)
                                      for l in open(f"{out}/{name}.log")) if m and int(m.group(1)) > 2]
    return statistics.median(tokens / (x / 1000) for x in ms)
rows = []
if have_before:
    rows.append(("before: run-to-run, 2nd run beside a busy process", compare("before_quiet", "before_busy")))
rows += [
    ("after: run-to-run, 2nd run beside a busy process", compare("after_quiet", "after_busy")),
    (f"after: --threads 1 vs default ({cores} threads)", compare("after_t1", "after_quiet")),
    (f"after: --threads 4 vs default ({cores} threads)", compare("after_t4", "after_quiet")),
    (f"after: {iters//2} + save + resume to {iters} vs {iters} straight", compare("after_quiet", "after_resume")),
]
print("\n| check | result |\n|---|---|")
for k, v in rows:
    print(f"| {k} | {v} |")
print("\n| binary | tokens/s (median over iterations 3..N, quiet run, from the console log) |\n|---|---|")
if have_before:
    b = tps("before_quiet")
    print(f"| before | {b:.0f} |")
a = tps("after_quiet")
print(f"| after | {a:.0f} |")
if have_before:
    print(f"\nafter/before = {a / b:.3f}")
for t in (1, 4):
    print(f"after --threads {t}: {tps(f'after_t{t}'):.0f} tokens/s")
PYEOF
