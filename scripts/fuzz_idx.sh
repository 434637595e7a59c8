#!/usr/bin/env bash
# A fuzzing session against the .idx/.bin reader (datasets/tests/fuzz_idx.rs), built with the
# test profile (optimised in this workspace; RELEASE=1 for --release):
# seeded mutations of valid datasets (and of ../shared/data's tinyshakespeare index when
# present) for SECONDS seconds; prints inputs, opened/rejected counts, panics (must be 0) and
# the largest single allocation. Inputs that panic are kept in FAILURES.
#   FUZZ_SECONDS=600 SEED=24301 FAILURES=/tmp/fuzz_idx_failures bash scripts/fuzz_idx.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export FUZZ_IDX_SECONDS="${SECONDS_BUDGET:-${FUZZ_SECONDS:-600}}"
export FUZZ_IDX_SEED="${SEED:-24301}"
export FUZZ_IDX_FAILURES="${FAILURES:-/tmp/fuzz_idx_failures}"
cargo test ${RELEASE:+--release} -p megatron-datasets --test fuzz_idx -- --ignored --nocapture --exact fuzz_idx_session
