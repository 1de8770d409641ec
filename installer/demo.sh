#!/usr/bin/env bash
# The README's main-job command. Sets up everything (idempotent), builds, and runs the
# embedded default with no network: `tessera-cli demo` builds a small Llama-architecture
# model and a byte-level tokenizer, generates a string-task dataset, fine-tunes the model,
# reports held-out accuracy before and after, exports it and prints sample generations.
#   TESSERA_DEMO_DIR  where the demo writes (default: tessera-demo/ in the checkout)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/installer/env.sh"

bash "$ROOT/installer/bootstrap.sh"
tessera_configure_and_build

"$BUILD_DIR/app/cli/tessera-cli" demo --out "${TESSERA_DEMO_DIR:-$ROOT/tessera-demo}" "$@"
