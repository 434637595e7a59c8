#!/usr/bin/env bash
# A long fuzzing session against a real `megatron serve` on 127.0.0.1 (issue 10, item 3).
#
#   flock /work/heavy.lock scripts/fuzz_serve.sh [SECONDS=600] [CLIENT_THREADS=4]
#
# Trains a tiny checkpoint on mock data, starts `megatron serve` on a free loopback port,
# runs the ignored test `serve_fuzz::fuzz_external_server` (the generator of
# tests/serve_fuzz.rs) against it for SECONDS, samples the server's RSS every 10 s, and
# prints the counts (requests, answers by status, closes without answer, connection errors,
# invariant violations) and the RSS trace. Fails if the server died or a violation was seen.
set -euo pipefail
SECS=${1:-600}
THREADS=${2:-4}
cd "$(dirname "$0")/.."
export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1}
# The dev profile is optimised (opt-level 2): no separate release build on small machines.
cargo build --bin megatron
# The test binary is run directly so no cargo lock is held during the session.
FUZZ=$(cargo test --test serve_fuzz --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "serve_fuzz":
        print(m["executable"])')
BIN=target/debug/megatron
WORK=$(mktemp -d)
cleanup() { [ -n "${SERVER_PID:-}" ] && kill "$SERVER_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
"$BIN" pretrain --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 \
  --max-position-embeddings 64 --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --mock-data \
  --vocab-size 100 --train-iters 2 --save "$WORK/ckpt" --save-interval 2 --eval-interval 100 \
  --log-interval 1 >"$WORK/pretrain.log" 2>&1
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN" serve --load "$WORK/ckpt" --host 127.0.0.1 --port "$PORT" --quiet >"$WORK/serve.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" 2>/dev/null && break
  sleep 0.2
done
rss() { awk '/VmRSS/ {print $2}' "/proc/$SERVER_PID/status" 2>/dev/null || echo dead; }
echo "server pid $SERVER_PID port $PORT, start RSS $(rss) KiB"
( while kill -0 "$SERVER_PID" 2>/dev/null; do echo "$(date +%s) $(rss)"; sleep 10; done ) >"$WORK/rss.log" &
SAMPLER=$!
STATUS=0
MEGATRON_FUZZ_ADDR=127.0.0.1:$PORT MEGATRON_FUZZ_SECS=$SECS MEGATRON_FUZZ_THREADS=$THREADS \
  "$FUZZ" --ignored --nocapture fuzz_external_server 2>&1 \
  | grep -E "FUZZ RESULT|test result|panicked|violation|failed" || STATUS=1
kill "$SAMPLER" 2>/dev/null || true
if kill -0 "$SERVER_PID" 2>/dev/null; then
  echo "server alive after ${SECS}s, RSS $(rss) KiB"
else
  echo "SERVER DIED"; tail -5 "$WORK/serve.log"; STATUS=1
fi
awk 'NR==1 {min=$2} {if ($2<min) min=$2; if ($2>max) max=$2; v[NR]=$2}
     END {print "RSS samples: " NR ", min " min " KiB, max " max " KiB; trace (KiB) at 0/25/50/75/100%: " \
          v[1] " " v[int(NR/4)+1] " " v[int(NR/2)+1] " " v[int(3*NR/4)+1] " " v[NR]}' "$WORK/rss.log"
exit $STATUS
