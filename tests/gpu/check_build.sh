#!/usr/bin/env bash
# Checks here, on a machine without a GPU, that tests/gpu/run.sh's build works before a session
# spends GPU time on it: the engine, its plugins, tessera-cli and the test probes, without Qt and
# without the Hub client, against the LibTorch version of the lent GPU machines (torch 2.11.0,
# CUDA 13.0: the same wheel their PyTorch is) and the Debian packages tests/gpu/fetch_debs.sh
# puts in build-gpu/deps/ (unpacked into a prefix, as there). Nothing runs on a GPU.
#
#   bash tests/gpu/check_build.sh            # ~12 min cold on 2 cores, ~4 with ccache
#
# It leaves tessera-cli, the two probes and the CUDA module in build-gpu/bin/ (ignored by git):
# carried with build-gpu/deps, `bash tests/gpu/run.sh --prebuilt build-gpu/bin` runs the check there without building (~100 s of
# device time saved; the same LibTorch, so the same ABI — session 23 ran the probes so).
#
# The wheel goes (without its CUDA dependencies: the venv's CUDA 13 libraries are linked
# against) into ~/.cache/tessera/torch-2.11.0; the build into build-torch-2.11/.
#   TESSERA_GPU_TORCH_VERSION (default 2.11.0), TESSERA_VENV, TESSERA_HOME
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { sed -n '2,17p' "$0"; exit 0; }
TESSERA_HOME="${TESSERA_HOME:-$HOME/.cache/tessera}"
VENV="${TESSERA_VENV:-$TESSERA_HOME/venv}"
VERSION="${TESSERA_GPU_TORCH_VERSION:-2.11.0}"
TARGET="$TESSERA_HOME/torch-$VERSION"
if [[ ! -f "$TARGET/.tessera-stamp" ]]; then
  echo "check_build: installing torch==$VERSION (no dependencies) into $TARGET" >&2
  rm -rf "$TARGET"
  "$VENV/bin/python" -m pip install -q --no-deps --target "$TARGET" "torch==$VERSION"
  echo "$VERSION" >"$TARGET/.tessera-stamp"
fi
# torch's CMake and our link find the CUDA libraries beside torch (nvidia/*/lib), as in a venv.
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
[[ -e "$TARGET/nvidia" ]] || ln -s "$site/nvidia" "$TARGET/nvidia"
bash "$ROOT/tests/gpu/fetch_debs.sh"
export CCACHE_DIR="${CCACHE_DIR:-$TESSERA_HOME/ccache}" CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"
# A fresh configure each time (the objects stay): a cache left by another configure of this folder
# kept the venv's LibTorch and Qt on in session 23.
rm -f "$ROOT/build-torch-$VERSION/CMakeCache.txt"
TESSERA_TORCH_DIR="$TARGET/torch/share/cmake/Torch" TESSERA_GPU_PYTHON="$VENV/bin/python" \
  bash "$ROOT/tests/gpu/run.sh" --only-build --build-dir "$ROOT/build-torch-$VERSION" \
  --out "$ROOT/build-torch-$VERSION/report" --jobs "${TESSERA_BUILD_JOBS:-$(nproc)}"
BUILT="$ROOT/build-torch-$VERSION"
mkdir -p "$ROOT/build-gpu/bin"
# The CUDA module beside them: the programs look for it in their own folder first.
cp "$BUILT/app/cli/tessera-cli" "$BUILT/tests/tools/tessera-model-probe" \
  "$BUILT/tests/tools/tessera-train-probe" "$BUILT/engine/libtessera_cuda.so" "$ROOT/build-gpu/bin/"
# The commit they were built from (run.sh --prebuilt prints it beside the checkout's), and whether
# the tree had changes beside it.
revision="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
git -C "$ROOT" diff --quiet HEAD 2>/dev/null || revision="$revision (with uncommitted changes)"
echo "$revision" >"$ROOT/build-gpu/bin/REVISION"
echo "check_build: tessera-cli, the probes and libtessera_cuda.so in build-gpu/bin/ (run.sh --prebuilt build-gpu/bin)" >&2
