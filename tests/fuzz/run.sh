#!/usr/bin/env bash
# Builds the libFuzzer targets (build-fuzz/, clang with ASan + UBSan; tests/fuzz/CMakeLists.txt)
# and fuzzes each parser for a bounded time, starting from its seeds (tests/fuzz/corpus/<target>)
# and every input that ever failed (tests/fuzz/regressions/<target>). Fails on any finding: a
# crash, a sanitizer report, an exception other than tessera::Error, a violated property, an
# input slower than 10 s or a process over 2 GB. A failing input is saved under
# build-fuzz/findings/<target>/; once fixed, it belongs in tests/fuzz/regressions/<target>/.
#
#   tests/fuzz/run.sh                          20 s per target
#   tests/fuzz/run.sh --minutes 30             30 minutes per target
#   tests/fuzz/run.sh --seconds-per-target 5 --targets "fuzz_config fuzz_job_spec"
#   tests/fuzz/run.sh --build-only             only build (the suite's fuzz_build, on both cores)
#   tests/fuzz/run.sh --no-build ...           only fuzz what is built (the suite's fuzz_parsers)
#   TESSERA_FUZZ_BUILD_DIR (default build-fuzz/), TESSERA_FUZZ_BUILD_JOBS (default: all cores)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${TESSERA_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
SECONDS_PER_TARGET=20
ONLY=""
BUILD_ONLY=0
NO_BUILD=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --minutes) SECONDS_PER_TARGET=$(( $2 * 60 )); shift 2 ;;
    --seconds-per-target) SECONDS_PER_TARGET="$2"; shift 2 ;;
    --targets) ONLY="$2"; shift 2 ;;
    --build-only) BUILD_ONLY=1; shift ;;
    --no-build) NO_BUILD=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [[ $NO_BUILD == 0 ]]; then
  build_started=$SECONDS
  if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
    CC="${TESSERA_FUZZ_CC:-clang}" CXX="${TESSERA_FUZZ_CXX:-clang++}" \
      cmake -S "$ROOT/tests/fuzz" -B "$BUILD" >/dev/null
  fi
  cmake --build "$BUILD" -j"${TESSERA_FUZZ_BUILD_JOBS:-$(nproc)}" >"$BUILD/build.log" 2>&1 ||
    { tail -40 "$BUILD/build.log"; echo "run.sh: the fuzz build failed (log: $BUILD/build.log)" >&2; exit 1; }
  echo "fuzz build: $(( SECONDS - build_started )) s"
fi
[[ $BUILD_ONLY == 1 ]] && exit 0

if [[ -n "$ONLY" ]]; then
  read -r -a targets <<<"$ONLY"
else
  targets=()
  for exe in "$BUILD"/fuzz_*; do [[ -x "$exe" && -f "$exe" ]] && targets+=("$(basename "$exe")"); done
fi
[[ ${#targets[@]} -gt 0 ]] || { echo "run.sh: no fuzz targets in $BUILD" >&2; exit 1; }

# Leaks inside the pyarrow wheel's libraries are theirs (tests/fuzz/lsan.supp says which).
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$ROOT/tests/fuzz/lsan.supp"
# The JSON dictionary helps every target: most inputs are JSON or carry some.
common=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -dict="$ROOT/tests/fuzz/json.dict")
failed=()
printf '%-26s %10s %8s %8s  %s\n' target executions seconds corpus result
for target in "${targets[@]}"; do
  exe="$BUILD/$target"
  [[ -x "$exe" ]] || { echo "run.sh: no such target $target" >&2; exit 2; }
  seeds="$ROOT/tests/fuzz/corpus/$target"
  regressions="$ROOT/tests/fuzz/regressions/$target"
  work="$BUILD/corpus/$target"  # grows across runs; the repository's seeds are only read
  findings="$BUILD/findings/$target/$(date +%Y%m%d-%H%M%S)"  # this run's failing inputs
  log="$BUILD/logs/$target.log"
  mkdir -p "$work" "$findings" "$(dirname "$log")"
  started=$SECONDS
  result=ok
  : >"$log"
  # Every input that ever failed, once each, before any fuzzing.
  if compgen -G "$regressions/*" >/dev/null; then
    "$exe" "${common[@]}" -artifact_prefix="$findings/" "$regressions"/* >>"$log" 2>&1 ||
      result="regression failed"
  fi
  if [[ $result == ok ]]; then
    inputs=("$work")
    [[ -d "$seeds" ]] && inputs+=("$seeds")
    [[ -d "$regressions" ]] && inputs+=("$regressions")
    # The outer timeout catches a fuzzer that hangs outside an input (it never should).
    (cd "$findings" && timeout $(( SECONDS_PER_TARGET + 120 )) "$exe" "${common[@]}" \
      -max_total_time="$SECONDS_PER_TARGET" -artifact_prefix="$findings/" "${inputs[@]}") \
      >>"$log" 2>&1 || result="FINDING"
  fi
  executions=$({ grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" || true; } |
    awk '{s += $2} END {print s + 0}')
  printf '%-26s %10s %8s %8s  %s\n' "$target" "$executions" "$(( SECONDS - started ))" \
    "$(find "$work" -type f | wc -l)" "$result"
  if [[ $result != ok ]]; then
    failed+=("$target")
    { grep -E 'ERROR|SUMMARY|runtime error|property violated|terminate|what\(\)' "$log" || true; } |
      head -8 | sed 's/^/    /'
    for artifact in "$findings"/*; do
      [[ -f "$artifact" ]] || continue
      echo "    input: $artifact"
      echo "    rerun: $exe $artifact"
      echo "    keep once fixed: mkdir -p $regressions && cp $artifact $regressions/"
    done
    echo "    log: $log"
  fi
  rmdir "$findings" 2>/dev/null || true  # nothing found
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "run.sh: findings in ${failed[*]}" >&2
  exit 1
fi
echo "run.sh: ${#targets[@]} targets, no findings (${SECONDS_PER_TARGET} s each)"
