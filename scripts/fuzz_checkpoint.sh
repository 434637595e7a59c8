#!/usr/bin/env bash
# A long fuzzing session of the checkpoint loader (tests/checkpoint_fuzz.rs): seeded mutations
# of metadata.json and of the safetensors shard (header JSON, header length, bytes) fed to the
# loaders of generate/serve/export and of pretrain --load. Prints cases, errors, panics (must
# be 0) and the largest single allocation.
#
#   scripts/fuzz_checkpoint.sh [SECONDS=600] [SEED=1]
#
# Runs under `flock /work/heavy.lock` when that lock file's directory exists (shared machines;
# NO_LOCK=1 runs without it).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
seed="${2:-1}"
# Build, then run the test binary itself: `cargo test` would hold the build lock all session.
bin=$(cargo test --test checkpoint_fuzz --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*checkpoint_fuzz[^"]*\)".*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "could not build tests/checkpoint_fuzz.rs"; exit 1; }
cmd=(env MEGATRON_FUZZ_SECONDS="$seconds" MEGATRON_FUZZ_SEED="$seed" "$bin" --nocapture --test-threads 1)
if [ -z "${NO_LOCK:-}" ] && [ -d /work ] && command -v flock >/dev/null; then
    flock /work/heavy.lock "${cmd[@]}"
else
    "${cmd[@]}"
fi
