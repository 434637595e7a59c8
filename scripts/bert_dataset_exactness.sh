#!/usr/bin/env bash
# BERT dataset exactness on tiny Shakespeare (issue 15, item 3): sentence-split with our
# `megatron preprocess` (BertWordPieceLowerCase, bert-base-uncased vocab), then the first
# COUNT samples (seed 1234, seq 128) built by megatron_datasets::bert and by Megatron-LM's own
# code (scripts/bert_dataset_oracle.py: megatron-core's helpers_cpp.build_mapping and
# BERTMaskedWordPieceDataset.__getitem__) must be equal, with and without the binary head;
# then the mask statistics of 10,000 samples. Needs /work/venv (megatron-core) or PYTHON=.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-/work/venv/bin/python}
DATA=${DATA:-../shared/data}
OUT=${OUT:-$(mktemp -d)}
COUNT=${COUNT:-1000}
VOCAB=$DATA/bert-base-uncased/vocab.txt
cargo build --release -p megatron-datasets --example bert_samples
cargo build --release --bin megatron
target/release/megatron preprocess --input "$DATA/tinyshakespeare.jsonl" --output-prefix "$OUT/shakes" \
  --tokenizer-type BertWordPieceLowerCase --vocab-file "$VOCAB" --split-sentences --workers 1
P=$OUT/shakes_text_sentence
for flag in "" "--bert-no-binary-head"; do
  target/release/examples/bert_samples "$P" "$VOCAB" 128 1234 10000 "$COUNT" samples "$OUT/ours.jsonl" $flag
  "$PY" scripts/bert_dataset_oracle.py samples --prefix "$P" --vocab "$VOCAB" --seq-length 128 --seed 1234 \
    --num-samples 10000 --count "$COUNT" --out "$OUT/megatron.jsonl" $flag 2> >(grep -vi warn >&2)
  "$PY" - "$OUT/ours.jsonl" "$OUT/megatron.jsonl" "${flag:-binary head}" <<'PYEOF'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
same = sum(x == y for x, y in zip(a, b))
print(f"{sys.argv[3]}: {same} of {len(b)} samples equal to Megatron-LM's ({len(a)} ours)")
sys.exit(0 if same == len(a) == len(b) else 1)
PYEOF
done
target/release/examples/bert_samples "$P" "$VOCAB" 128 1234 10000 10000 stats
