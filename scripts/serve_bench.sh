#!/usr/bin/env bash
# Continuous vs static batching (issue 21, item 2): `megatron bench serve` on each model shape,
# both modes in the same run (only the ratio within one run means anything on a shared
# machine), then one summary line per shape. Every knob is an environment variable, so a run
# can be repeated on a quieter machine:
#
#   flock /work/heavy.lock scripts/serve_bench.sh
#   PRESETS="gpt2-124m" CLIENTS=32 REQUESTS=2 PROMPT_LEN=8:64 scripts/serve_bench.sh
#
#   BIN          megatron binary (default: build target/release/megatron)
#   PRESETS      model shapes, any of `tiny` (4 layers) and `gpt2-124m` (default: both)
#   CLIENTS      concurrent clients (32)          REQUESTS    requests per client (1)
#   PROMPT_LEN   prompt tokens MIN:MAX (8:32)     OUTPUT_LEN  output tokens MIN:MAX (8:32)
#   MAX_BATCH    slots / static batch (32)        PREFILL_TOKENS  prefill tokens per step (256)
#   MODES        order of the modes ("continuous static")
#   STREAM       1: also the OpenAI streaming protocol (TTFT, ITL) on continuous (1)
#   THREADS      CPU threads of the backend (default: all)
#   TIMEOUT      seconds a request may take (600)  SEED  workload seed (7)
#   OUT          also append the raw JSON lines to this file
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${BIN:-}" ]; then
  cargo build --release --bin megatron
  BIN=target/release/megatron
fi
PRESETS=${PRESETS:-"tiny gpt2-124m"}
args=(--clients "${CLIENTS:-32}" --requests "${REQUESTS:-1}" --prompt-len "${PROMPT_LEN:-8:32}"
  --output-len "${OUTPUT_LEN:-8:32}" --max-batch-size "${MAX_BATCH:-32}"
  --prefill-tokens "${PREFILL_TOKENS:-256}" --timeout "${TIMEOUT:-600}" --seed "${SEED:-7}"
  --batching ${MODES:-continuous static})
[ "${STREAM:-1}" = 1 ] && args+=(--stream)
[ -n "${THREADS:-}" ] && args+=(--threads "$THREADS")
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo '?') load: $(cut -d' ' -f1-3 /proc/loadavg)"
for preset in $PRESETS; do
  log=$(mktemp)
  "$BIN" bench serve --preset "$preset" "${args[@]}" | tee "$log"
  [ -n "${OUT:-}" ] && { echo "# preset $preset"; grep '^{' "$log"; } >>"$OUT"
  echo "== $preset: $(grep '^continuous / static' "$log" || echo 'no ratio (both modes needed)')"
  rm -f "$log"
done
echo "# done $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
