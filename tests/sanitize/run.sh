#!/usr/bin/env bash
# The unit tests under AddressSanitizer and UndefinedBehaviorSanitizer (issue 15), built apart
# with TESSERA_SANITIZE=address,undefined, then `ctest -L unit` there. Any sanitizer report fails
# its test. The parsers are also fuzzed under the same sanitizers (tests/fuzz/run.sh).
#
#   tests/sanitize/run.sh               the torch-free layers (core, hf, data, job, memory, plan,
#                                       hub) and their suites, in build-sanitize/ (~15 min cold)
#   tests/sanitize/run.sh --with-torch  every unit suite, the LibTorch layers (model, optim,
#                                       train, plugins, export) too, in build-sanitize-torch/
#                                       (~45 min cold on 2 cores). LibTorch itself is not
#                                       instrumented: our code's accesses are checked (and every
#                                       leak LeakSanitizer sees; none needed suppressing).
#   TESSERA_SANITIZE_BUILD_DIR, TESSERA_SANITIZERS (default address,undefined),
#   TESSERA_SANITIZE_BUILD_JOBS (default: all cores)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WITH_TORCH=OFF
while [[ $# -gt 0 ]]; do
  case "$1" in
    --with-torch) WITH_TORCH=ON; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
default_build="$ROOT/build-sanitize"
[[ $WITH_TORCH == ON ]] && default_build="$ROOT/build-sanitize-torch"
BUILD="${TESSERA_SANITIZE_BUILD_DIR:-$default_build}"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/tessera/ccache}" CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -G Ninja -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTESSERA_WITH_TORCH="$WITH_TORCH" -DTESSERA_WITH_CUDA=OFF \
    -DTESSERA_SANITIZE="${TESSERA_SANITIZERS:-address,undefined}" \
    -DTESSERA_PYTHON="${TESSERA_VENV:-$HOME/.cache/tessera/venv}/bin/python" >/dev/null
fi
# Only the unit suites (and what they link): the studio and the CLI are not needed here. A unit
# test that is a script (the installer's, in Python) has no target of its own and is left out.
mapfile -t targets < <(ninja -C "$BUILD" -t targets all | sed -n 's/^\([A-Za-z0-9_-]*\): phony$/\1/p')
suites=()
while read -r name; do
  printf '%s\n' "${targets[@]}" | grep -qx "$name" && suites+=("$name")
done < <(ctest --test-dir "$BUILD" -N -L unit | sed -n 's/^ *Test *#[0-9]*: //p')
[[ ${#suites[@]} -gt 0 ]] || { echo "sanitize: no unit tests configured in $BUILD" >&2; exit 1; }
cmake --build "$BUILD" -j"${TESSERA_SANITIZE_BUILD_JOBS:-$(nproc)}" --target "${suites[@]}"
# halt_on_error: the first report fails the test; detect_leaks: memory a test never frees.
export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$ROOT/tests/sanitize/lsan.supp}"
ctest --test-dir "$BUILD" -L unit --output-on-failure
