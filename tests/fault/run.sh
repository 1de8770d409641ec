#!/usr/bin/env bash
# The long form of the fault tests: tests/fault/run.sh [--kills N] [--seed S] (default 100 kills
# per configuration). Needs a build (installer/test.sh or README's "Building by hand").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
KILLS=100
SEED=15
while (($#)); do
  case "$1" in
    --kills) KILLS="$2"; shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    *) echo "usage: tests/fault/run.sh [--kills N] [--seed S]" >&2; exit 2 ;;
  esac
done
BUILD="${TESSERA_BUILD_DIR:-$ROOT/build}"
export TESSERA_CLI="$BUILD/app/cli/tessera-cli" TESSERA_FAULT_KILLS="$KILLS" TESSERA_FAULT_SEED="$SEED"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false XDG_CACHE_HOME="$BUILD/test-cache"
exec "${TESSERA_VENV:-$HOME/.cache/tessera/venv}/bin/python" -m pytest -q -s -p no:cacheprovider \
  "$ROOT/tests/fault/test_kill_anywhere.py"
