#!/usr/bin/env bash
# The README's main-job command. Installs what the product needs (idempotent: Debian packages,
# and the torch and pyarrow wheels, which carry LibTorch and Arrow's C++ libraries), builds tessera-cli and the studio only (not the
# tests), and runs the embedded default with no network: `tessera-cli demo` builds a small
# Llama-architecture model and a byte-level tokenizer, generates a string-task dataset,
# fine-tunes the model, reports held-out accuracy before and after, exports it and prints sample
# generations.
#   TESSERA_DEMO_DIR  where the demo writes (default: tessera-demo/ in the checkout)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/installer/env.sh"
START=$SECONDS
phase() { printf '[demo %4ds] %s\n' "$((SECONDS - START))" "$*" >&2; }

phase "installing what the product needs (installer/bootstrap.sh --for product)"
bash "$ROOT/installer/bootstrap.sh" --for product
if [[ -x "$BUILD_DIR/app/cli/tessera-cli" ]]; then
  phase "building tessera-cli and the studio: what changed since the last build"
else
  phase "building tessera-cli and the studio in $BUILD_DIR (the first time about 7 minutes on 2 cores; ninja counts the steps; later builds reuse the compiler cache $CCACHE_DIR)"
fi
tessera_configure_and_build tessera-cli tessera
phase "running the demo (about 45 seconds on 2 cores)"
"$BUILD_DIR/app/cli/tessera-cli" demo --out "${TESSERA_DEMO_DIR:-$ROOT/tessera-demo}" "$@"
phase "done: the build is in $BUILD_DIR (remove: rm -rf $BUILD_DIR); bash installer/test.sh installs the rest and runs the tests"
