#!/usr/bin/env bash
# The README quick start: raw text → byte-level BPE tokenizer → Megatron .bin/.idx dataset →
# pretrain a small GPT → generate from the checkpoint. Everything lands in $RUN.
#
# Text: the King James Bible (public domain, 4.3 MB), installed from Debian's `bible-kjv` and
# `bible-kjv-text` packages (unpacked locally: no root needed). Use your own text instead with
# TEXT=/path/to/file.txt (documents separated by blank lines).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/quickstart}
ITERS=${ITERS:-300}
mkdir -p "$RUN"

cargo build --release
M=target/release/megatron

# 1. Raw text.
TEXT=${TEXT:-$RUN/kjv.txt}
if [ ! -s "$TEXT" ]; then
  command -v apt-get >/dev/null || { echo "apt-get not found: set TEXT=/path/to/text.txt"; exit 1; }
  pkgs=$(mktemp -d)
  (cd "$pkgs" && apt-get download bible-kjv bible-kjv-text)
  for deb in "$pkgs"/*.deb; do dpkg-deb -x "$deb" "$pkgs/root"; done
  # One document per chapter: drop the "Genesis 1" headings and the verse numbers.
  "$pkgs/root/usr/bin/bible" -p "$pkgs/root/usr/lib" "Gen1:1-Rev22:21" \
    | sed -E '/^([1-3] )?[A-Z][A-Za-z ]* [0-9]+$/d; s/^ +[0-9]+ //' > "$TEXT.tmp"
  mv "$TEXT.tmp" "$TEXT"
  rm -rf "$pkgs"
fi
echo "== text: $TEXT ($(wc -c < "$TEXT") bytes)"

# 2. A GPT-2-format BPE vocabulary trained on it.
$M tokenizer train --input "$TEXT" --vocab-size 4096 --special-tokens '<|endoftext|>' --output-dir "$RUN/tokenizer"

# 3. Megatron's preprocess_data.py: one document per paragraph, EOD appended.
$M preprocess --input "$TEXT" --input-format text-paragraphs --output-prefix "$RUN/corpus" \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$RUN/tokenizer/vocab.json" \
  --merge-file "$RUN/tokenizer/merges.txt" --append-eod --workers 2 --log-interval 500

# 4. Pretrain a 4-layer GPT on it (continues from the last checkpoint when run again).
$M pretrain \
  --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 \
  --max-position-embeddings 256 --micro-batch-size 8 --global-batch-size 16 \
  --train-iters "$ITERS" --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters $(( ITERS / 10 )) \
  --weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0 \
  --data-path "$RUN/corpus_text_document" --split 98,2,0 \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$RUN/tokenizer/vocab.json" \
  --merge-file "$RUN/tokenizer/merges.txt" \
  --log-interval 25 --eval-interval 100 --eval-iters 5 \
  --save "$RUN/checkpoints" --save-interval 100 --load "$RUN/checkpoints" \
  --metrics-jsonl "$RUN/metrics.jsonl"

# 5. Sample from the trained model.
$M generate --load "$RUN/checkpoints" --prompt "And God said unto Moses," \
  --tokens-to-generate 60 --temperature 0.8 --top-k 20 --seed 1234
