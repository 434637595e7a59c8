#!/usr/bin/env bash
# Issue 11 audit: does every model train in --bf16 / --fp16, and does full recomputation leave
# its results unchanged? Tiny configs on mock data (seconds each; losses only, no timing):
#   1. per model, fp32 vs --bf16 vs --fp16 (initial loss scale 2^16 unless FP16_SCALE is set):
#      the mean lm loss of the last 10 iterations and its difference to fp32;
#   2. per model that offers it, the fp32 run again with --recompute-granularity full
#      (uniform 1 and block 1): the lm losses and grad norms of every iteration must be the same
#      bits (printed: identical / DIFFERENT).
#   M=target/debug/megatron ITERS=60 bash scripts/half_models.sh
# MoE runs need the plugin library: MOE=target/debug/libmegatron_moe.so (cargo build -p megatron-moe).
set -euo pipefail
cd "$(dirname "$0")/.."
M="${M:-target/debug/megatron}"
ITERS="${ITERS:-60}"
MOE="${MOE:-target/debug/libmegatron_moe.so}"
OUT="${OUT:-$(mktemp -d /tmp/half_models.XXXXXX)}"
FP16_SCALE="${FP16_SCALE:-65536}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
[ -x "$M" ] || { echo "no binary at $M: cargo build --bin megatron first" >&2; exit 1; }
COMMON="--micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine \
 --lr-warmup-iters 5 --weight-decay 0.01 --clip-grad 1.0 --seed 1234 --log-interval 1 --eval-interval 1000000 \
 --eval-iters 1 --mock-data --vocab-size 256 --train-iters $ITERS --hidden-dropout 0.1 --attention-dropout 0.1"
GPT="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32"
LLAMA="$GPT --position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear \
 --group-query-attention --num-query-groups 2 --untie-embeddings-and-output-weights"
MOEF="--plugin $MOE --num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3"
HYB="--model hybrid --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 \
 --mamba-state-dim 16 --mamba-head-dim 16 --mamba-num-groups 1 --mamba-chunk-size 16 --normalization RMSNorm"

declare -A MODELS=(
  [gpt]="$GPT"
  [llama]="$LLAMA"
  [gpt_moe]="$GPT $MOEF"
  [hybrid]="$HYB --hybrid-layer-pattern M*-M"
  [hybrid_moe]="$HYB --hybrid-layer-pattern M*EM $MOEF"
  [mamba]="--model mamba --num-layers 3 --hidden-size 64 --seq-length 32 --mamba-state-dim 16 --mamba-head-dim 16 \
 --mamba-num-groups 1 --mamba-chunk-size 16 --normalization RMSNorm --num-attention-heads 4"
)
ORDER="${ORDER:-gpt llama gpt_moe hybrid hybrid_moe mamba}"

run() { # name flags...
  local name=$1; shift
  # shellcheck disable=SC2086
  if "$M" pretrain $COMMON "$@" --metrics-jsonl "$OUT/$name.jsonl" > "$OUT/$name.log" 2>&1; then
    echo "ok   $name"
  else
    echo "FAIL $name: $(grep -m1 -iE 'error|invalid|panick' "$OUT/$name.log" || tail -1 "$OUT/$name.log")"
  fi
}
for m in $ORDER; do
  f="${MODELS[$m]}"
  run "${m}_fp32" $f
  run "${m}_bf16" $f --bf16
  run "${m}_fp16" $f --fp16 --initial-loss-scale "$FP16_SCALE"
  run "${m}_full_uniform" $f --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
  run "${m}_full_block" $f --recompute-granularity full --recompute-method block --recompute-num-layers 1
  run "${m}_bf16_full" $f --bf16 --recompute-granularity full --recompute-method uniform --recompute-num-layers 2
done
"$PY" - "$OUT" "$ITERS" $ORDER <<'PYEOF'
import json, os, sys
out, iters, models = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def tags(name):
    p = f"{out}/{name}.jsonl"
    if not os.path.exists(p):
        return None
    d = {}
    for line in open(p):
        r = json.loads(line)
        if r.get("tag") in ("lm loss", "grad-norm", "loss-scale"):
            d[(r["tag"], r["iteration"])] = r["value"]
    return d or None
def mean_loss(d):
    v = [d[("lm loss", i)] for i in range(iters - 9, iters + 1) if ("lm loss", i) in d]
    return sum(v) / len(v) if len(v) == 10 else None
print(f"| model | fp32 | bf16 | fp16 | full uniform 1 = fp32 | full block 1 = fp32 | bf16 full uniform 2 = bf16 |")
print("|---|---|---|---|---|---|---|")
for m in models:
    r = {k: tags(f"{m}_{k}") for k in ["fp32", "bf16", "fp16", "full_uniform", "full_block", "bf16_full"]}
    base = mean_loss(r["fp32"]) if r["fp32"] else None
    cells = []
    for k in ["fp32", "bf16", "fp16"]:
        x = mean_loss(r[k]) if r[k] else None
        if x is None:
            cells.append("fails")
        elif base is None or k == "fp32":
            cells.append(f"{x:.4f}")
        else:
            cells.append(f"{x:.4f} ({100 * (x - base) / base:+.2f}%)")
    for k, ref in [("full_uniform", "fp32"), ("full_block", "fp32"), ("bf16_full", "bf16")]:
        if r[k] is None or r[ref] is None:
            cells.append("fails")
        else:
            same = {t: v for t, v in r[k].items() if t[0] != "loss-scale"} == {t: v for t, v in r[ref].items() if t[0] != "loss-scale"}
            cells.append("bit-identical" if same else "DIFFERENT")
    print(f"| {m} | " + " | ".join(cells) + " |")
PYEOF
echo "logs: $OUT"
