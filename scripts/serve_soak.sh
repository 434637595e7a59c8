#!/usr/bin/env bash
# Soak of `megatron serve` (issue 21, item 4): 64 clients for 60 s — normal, streaming, chat,
# PUT /api, slow readers, slow writers, clients that disconnect, malformed requests — while
# /health is polled every 250 ms and the server's RSS is sampled every second.
#
#   flock /work/heavy.lock scripts/serve_soak.sh [SECONDS=60] [CLIENTS=64] [extra serve flags...]
#   e.g. scripts/serve_soak.sh 60 64 --nproc 2 --tensor-model-parallel-size 2
#
# Uses the release binary (`cargo build --release --bin megatron`; set BIN= to use another),
# trains a tiny checkpoint on tinyshakespeare (GPT-2 tokenizer; 2 layers, 64 hidden, 128 positions), serves
# it on a free loopback port and runs scripts/serve_soak.py against it. Fails if the soak
# reports a failure (any 5xx, an unanswered well-formed request, a missed /health poll) or the
# server died.
set -euo pipefail
SECS=${1:-60}
CLIENTS=${2:-64}
shift $(( $# >= 2 ? 2 : $# ))
cd "$(dirname "$0")/.."
if [ -z "${BIN:-}" ]; then
  cargo build --release --bin megatron
  BIN=target/release/megatron
fi
WORK=$(mktemp -d)
cleanup() { [ -n "${SERVER_PID:-}" ] && kill "$SERVER_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
# GPT-2's tokenizer (chat prompts are text); the prompts of the soak are digit strings.
DATA=${DATA:-../shared/data}
"$BIN" pretrain --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 \
  --max-position-embeddings 128 --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 \
  --lr-warmup-iters 1 --data-path "$DATA/tinyshakespeare_gpt2_text_document" \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$DATA/gpt2/vocab.json" --merge-file "$DATA/gpt2/merges.txt" \
  --train-iters 2 --save "$WORK/ckpt" --save-interval 2 --eval-interval 100 \
  --log-interval 1 >"$WORK/pretrain.log" 2>&1 || { tail -5 "$WORK/pretrain.log"; exit 1; }
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN" serve --load "$WORK/ckpt" --host 127.0.0.1 --port "$PORT" --quiet --max-batch-size 16 \
  --max-queue 32 --http-threads 64 "$@" >"$WORK/serve.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 150); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" 2>/dev/null && break
  sleep 0.2
done
echo "server pid $SERVER_PID port $PORT ($*), RSS $(awk '/VmRSS/ {print $2}' /proc/$SERVER_PID/status) KiB"
STATUS=0
python3 scripts/serve_soak.py --port "$PORT" --pid "$SERVER_PID" --clients "$CLIENTS" --duration "$SECS" || STATUS=1
if kill -0 "$SERVER_PID" 2>/dev/null; then
  echo "server alive after ${SECS}s"
else
  echo "SERVER DIED"; STATUS=1
fi
if grep -qiE "panick|error" "$WORK/serve.log"; then
  echo "server log:"; grep -iE "panick|error" "$WORK/serve.log" | head -5
fi
exit $STATUS
