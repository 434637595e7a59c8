#!/usr/bin/env bash
# A long fuzzing session of the Megatron-LM checkpoint reader (plugins/checkpoint-megatron/tests/
# fuzz.rs): seeded mutations of a real Megatron-LM data.pkl and of the whole torch.save zip,
# fed to the safe unpickler and the archive/tensor reader. Prints inputs, decoded, clean errors
# and panics (must be 0).
#
#   scripts/fuzz_megatron_checkpoint.sh [SECONDS=600] [SEED=1]
#
# Runs under `flock /work/heavy.lock` when /work exists (shared machines; NO_LOCK=1 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
seed="${2:-1}"
bin=$(cargo test --release -p megatron-checkpoint-megatron --test fuzz --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*fuzz-[^"]*\)".*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "could not build plugins/checkpoint-megatron/tests/fuzz.rs"; exit 1; }
cmd=(env FUZZ_SECONDS="$seconds" FUZZ_SEED="$seed" "$bin" mutated_pickles_and_zips_never_panic --nocapture)
if [ -z "${NO_LOCK:-}" ] && [ -d /work ] && command -v flock >/dev/null; then
    flock /work/heavy.lock "${cmd[@]}"
else
    "${cmd[@]}"
fi
