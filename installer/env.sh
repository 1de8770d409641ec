# Shared by installer scripts: where things live, and how we configure and build.
TESSERA_HOME="${TESSERA_HOME:-$HOME/.cache/tessera}"
TESSERA_VENV="${TESSERA_VENV:-$TESSERA_HOME/venv}"
BUILD_DIR="${TESSERA_BUILD_DIR:-$ROOT/build}"
# The compiler cache lives outside the checkout so fresh clones (CI) rebuild quickly.
export CCACHE_DIR="${CCACHE_DIR:-$TESSERA_HOME/ccache}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
# Paths under the checkout are hashed relative to it, so a fresh clone elsewhere hits the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"
# Needed for ccache to cache translation units that use CMake's precompiled headers.
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"

# Configures once, then builds the given targets (none: everything, the tests included).
tessera_configure_and_build() {
  if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
    cmake -G Ninja -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
      -DTESSERA_PYTHON="$TESSERA_VENV/bin/python"
  fi
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  cmake --build "$BUILD_DIR" -j "$(nproc)" "${targets[@]}"
}
