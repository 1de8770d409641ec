#!/usr/bin/env bash
# Sets up everything (idempotent), builds, and runs the test suite (all labels but `bench`).
#   TESSERA_BUILD_DIR   build folder (default: build/ in the checkout)
#   TESSERA_TEST_LABELS ctest label regex to run (default: everything except bench)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/installer/env.sh"

# Benchmark-only packages (DeepSpeed) are installed only when benchmarks are asked for.
if [[ "${TESSERA_TEST_LABELS:-}" == *bench* ]]; then
  export TESSERA_BENCH=1
fi
bash "$ROOT/installer/bootstrap.sh"
tessera_configure_and_build

args=(--test-dir "$BUILD_DIR" --output-on-failure --timeout 1200 -j2)
if [[ -n "${TESSERA_TEST_LABELS:-}" ]]; then
  args+=(-L "$TESSERA_TEST_LABELS")
else
  args+=(-LE bench)
fi
ctest "${args[@]}"
