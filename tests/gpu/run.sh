#!/usr/bin/env bash
# The GPU check (issue 25): one call on a lent GPU machine (a bare image with its own PyTorch,
# transformers, peft, pytest, nvcc, CMake and ninja; no Qt, no package registry) that builds the
# engine, its plugins, tessera-cli and the two test probes without Qt and without the Hub client
# against that machine's LibTorch, runs the GPU parity suite (tests/gpu/test_gpu.py) and the GPU
# benchmark (tests/gpu/bench_gpu.py), and writes a report. Prepare it here first:
#
#   bash tests/gpu/fetch_debs.sh          # the Debian packages the build needs, into build-gpu/deps/
#
# then, with the device tool, from the checkout's root, carrying build-gpu/deps:
#
#   bash tests/gpu/run.sh                 # everything; the report in $OUT (or --out DIR)
#
# What comes back: DIR/report.md (machine, build, each test's result, the benchmark's figures and
# where its steps spend the GPU's time, ours beside the Trainer's) and DIR/gpu-check-logs.tar.gz
# (every phase's log, pytest's XML, the figures as JSON, the profiles' traces): two
# files, as the device tool returns at most eight.
# Options: --out DIR (default $OUT, else build-gpu/report), --build-dir DIR (default build-gpu),
# --jobs N (default: every core), --no-bench, --only-build, --pytest-args "ARGS" (e.g. "-k
# logits": that selection alone, in one process), --prebuilt DIR (no build: tessera-cli and the
# probes from DIR, check_build.sh's build-gpu/bin built here against the same LibTorch; carry it
# too), --deadline S (default 500: the seconds from the start by which the suite and the
# benchmark end; the build's time comes out of the suite's, the benchmark keeps 150 s; a phase
# with under 30 s left is skipped, said so). The report and the logs' archive are written after
# each phase too, so that a call stopped at its limit still brings back what was done.
# Session 23 timed it on an H200: unpacking 16 s, configure 10 s, build 104 s (-j16), the suite
# 70 s in 4 pytest-xdist workers, the benchmark 28 s: 234 s in all. The last lines printed are
# the summary (report.md). Exit 0 when the build and every test passed; a strategy that still
# refuses CUDA ("not supported yet") is an expected failure, listed so.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REPORT="${OUT:-$ROOT/build-gpu/report}"
BUILD="$ROOT/build-gpu"
JOBS="$(nproc)"
BENCH=1
ONLY_BUILD=0
PYTEST_ARGS=""
PREBUILT=""
DEADLINE=500  # seconds from the start for the whole check; the suite and benchmark fit inside
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) REPORT="$2"; shift 2 ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --no-bench) BENCH=0; shift ;;
    --only-build) ONLY_BUILD=1; shift ;;
    --pytest-args) PYTEST_ARGS="$2"; shift 2 ;;
    --deadline) DEADLINE="$2"; shift 2 ;;
    --prebuilt) PREBUILT="$(cd "$2" && pwd)"; shift 2 ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$REPORT" "$BUILD"
LOGS="$BUILD/gpu-check-logs"  # every phase's files, packed into one at the end
rm -rf "$LOGS" && mkdir -p "$LOGS"
SECONDS=0
PYTHON="${TESSERA_GPU_PYTHON:-$(command -v python3)}"
phase() { printf '[gpu-check %3ds] %s\n' "$SECONDS" "$*" | tee -a "$LOGS/phases.log"; }
status_of() { echo "$1=$2" >>"$LOGS/status.txt"; }
# The report and the archive of the logs as they stand (a second or two): after each phase, so
# that a call stopped at its limit still returns what was done.
snapshot() {
  local tmp="$BASHPID.tmp"
  "$PYTHON" "$ROOT/tests/gpu/report.py" "$LOGS" >"$REPORT/report.md.$tmp" 2>"$LOGS/report.err" &&
    mv "$REPORT/report.md.$tmp" "$REPORT/report.md"
  # (exit 1: a log grew while it was read, which it may: the archive holds what was there)
  tar --warning=no-file-changed -czf "$REPORT/gpu-check-logs.tar.gz.$tmp" -C "$LOGS" . 2>/dev/null
  (($? <= 1)) && mv "$REPORT/gpu-check-logs.tar.gz.$tmp" "$REPORT/gpu-check-logs.tar.gz"
  rm -f "$REPORT"/*."$tmp"
}
# Seconds left before the deadline, less $1.
left() { echo $((DEADLINE - SECONDS - ${1:-0})); }
: >"$LOGS/status.txt"
: >"$LOGS/phases.log"

phase "machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
"$PYTHON" - >"$LOGS/machine.json" 2>"$LOGS/machine.err" <<'PY'
import json, os, platform, shutil, subprocess
import torch
facts = {
    "python": platform.python_version(),
    "torch": torch.__version__,
    "torch_cuda": torch.version.cuda,
    "cuda_available": torch.cuda.is_available(),
    "cores": os.cpu_count(),
    "nvcc": shutil.which("nvcc"),
    "cmake": shutil.which("cmake"),
    "ninja": shutil.which("ninja"),
    "pkg_config": shutil.which("pkg-config"),
}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    facts.update(gpu=p.name, capability=f"{p.major}.{p.minor}", gpu_memory=p.total_memory)
for module in ("transformers", "peft", "pytest", "safetensors", "tokenizers"):
    try:
        facts[module] = __import__(module).__version__
    except Exception as e:  # noqa: BLE001 - a missing oracle is a fact to report
        facts[module] = f"missing: {e}"
try:
    facts["driver"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30).stdout.strip()
except Exception:  # noqa: BLE001
    facts["driver"] = None
print(json.dumps(facts, indent=1))
PY
cat "$LOGS/machine.json" 2>/dev/null | tr -d '\n' | cut -c1-400; echo

# --- Debian packages carried in build-gpu/deps, unpacked into a prefix (never into /) -------------
PREFIX=/tmp/tessera-gpu-prefix
LIBDIR="$PREFIX/usr/lib/x86_64-linux-gnu"
if compgen -G "$ROOT/build-gpu/deps/*.deb" >/dev/null; then
  phase "unpacking $(ls "$ROOT"/build-gpu/deps/*.deb | wc -l) Debian packages into $PREFIX"
  mkdir -p "$PREFIX/bin"
  for deb in "$ROOT"/build-gpu/deps/*.deb; do dpkg-deb -x "$deb" "$PREFIX" || dpkg -x "$deb" "$PREFIX"; done
  if ! command -v pkg-config >/dev/null && [[ -x "$PREFIX/usr/bin/pkgconf" ]]; then
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$LIBDIR" "$PREFIX/usr/bin/pkgconf" \
      >"$PREFIX/bin/pkg-config"
    chmod +x "$PREFIX/bin/pkg-config"
    export PATH="$PREFIX/bin:$PATH"
  fi
  export PKG_CONFIG_SYSROOT_DIR="$PREFIX"
  export PKG_CONFIG_LIBDIR="$LIBDIR/pkgconfig:$PREFIX/usr/share/pkgconfig"
  export PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
else
  phase "no build-gpu/deps/*.deb (run tests/gpu/fetch_debs.sh here and carry build-gpu/deps): using the system's packages"
fi

# --- build ---------------------------------------------------------------------------------
# The CUDA 13 wheels beside torch (nvidia/cu13: bin/nvcc, lib), when $PYTHON has them.
CU13="$("$PYTHON" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))' 2>/dev/null)"
if [[ -n "$PREBUILT" ]]; then
  # Binaries built elsewhere against the same LibTorch (check_build.sh's, torch 2.11.0 + CUDA 13.0),
  # carried: no build here. Their RPATH names the build machine's LibTorch: this one's is put first.
  torch_lib="$("$PYTHON" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
  export LD_LIBRARY_PATH="$torch_lib:${CU13:+$CU13/lib:}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  CLI="$PREBUILT/tessera-cli"
  TOOLS="$PREBUILT"
  build_rc=0
  missing="$(ldd "$CLI" "$TOOLS/tessera-train-probe" "$TOOLS/tessera-model-probe" \
    "$PREBUILT/libtessera_cuda.so" 2>&1 | grep 'not found' | sort -u)"
  [[ -n "$missing" ]] && { build_rc=1; echo "$missing"; }
  status_of build $build_rc
  phase "prebuilt binaries from $PREBUILT (no build): $("$CLI" version 2>&1 | grep -E '^(Tessera|CUDA module)' | tr '\n' ' ')"
  # check_build.sh wrote the commit they were built from: binaries older than this checkout
  # would test old code.
  built_from="$(cat "$PREBUILT/REVISION" 2>/dev/null || echo unknown)"
  checkout="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
  phase "prebuilt from commit $built_from; this checkout: $checkout"
  [[ "$built_from" != unknown && "$checkout" != unknown && "${built_from%% *}" != "$checkout" ]] &&
    phase "WARNING: the prebuilt binaries are not this checkout's (rerun check_build.sh here)"
else
  # LibTorch: the one of $PYTHON's torch, or TESSERA_TORCH_DIR (a Torch CMake folder; check_build.sh
  # uses it to build here against the GPU machine's LibTorch version).
  torch_args=()
  if [[ -n "${TESSERA_TORCH_DIR:-}" ]]; then
    torch_args=(-DTorch_DIR="$TESSERA_TORCH_DIR")
    phase "configuring against the LibTorch in $TESSERA_TORCH_DIR, in $BUILD"
  else
    phase "configuring against torch $("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null) in $BUILD"
  fi
  # nvcc: Torch's CMake needs the CUDA toolkit; the image's may be off the PATH, or the pip one
  # beside torch.
  NVCC="$(command -v nvcc || true)"
  for candidate in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc ${CU13:+"$CU13/bin/nvcc"}; do
    [[ -z "$NVCC" && -x "$candidate" ]] && NVCC="$candidate"
  done
  cuda_args=()
  if [[ -n "$NVCC" ]]; then
    NVCC="$(readlink -f "$NVCC")"
    cuda_args=(-DCMAKE_CUDA_COMPILER="$NVCC" -DCUDAToolkit_ROOT="$(dirname "$(dirname "$NVCC")")")
    export PATH="$(dirname "$NVCC"):$PATH"
  fi
  phase "nvcc: ${NVCC:-none found} ($("${NVCC:-false}" --version 2>/dev/null | tail -2 | head -1)); c++: $(c++ --version 2>/dev/null | head -1)"
  export CCACHE_DIR="${CCACHE_DIR:-$BUILD/ccache}"
  # RPATH (not RUNPATH): the carried libraries' own dependencies (libicuuc → libicudata) are found
  # beside them without LD_LIBRARY_PATH, which would also reach the Python oracles.
  LINK_FLAGS="-Wl,--disable-new-dtags -Wl,-rpath,$LIBDIR"
  cmake -G Ninja -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DTESSERA_WITH_QT=OFF -DTESSERA_WITH_HUB=OFF -DTESSERA_WITH_PARQUET=OFF \
    -DTESSERA_BUILD_PROBES=ON -DTESSERA_WERROR=OFF \
    -DTESSERA_PYTHON="$PYTHON" -DCMAKE_PREFIX_PATH="$PREFIX/usr" "${torch_args[@]}" "${cuda_args[@]}" \
    -DCMAKE_CXX_FLAGS="-idirafter $PREFIX/usr/include" \
    -DCMAKE_EXE_LINKER_FLAGS="$LINK_FLAGS" -DCMAKE_SHARED_LINKER_FLAGS="$LINK_FLAGS" \
    -DTORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" \
    >"$LOGS/configure.log" 2>&1
  configure_rc=$?
  status_of configure $configure_rc
  build_rc=1
  phase "configure: exit $configure_rc; $(grep -m1 'Tessera: LibTorch' "$LOGS/configure.log")"
  if [[ $configure_rc == 0 ]]; then
    phase "building tessera-cli, tessera-model-probe, tessera-train-probe (-j$JOBS)"
    cmake --build "$BUILD" -j"$JOBS" --target tessera-cli tessera-model-probe tessera-train-probe \
      >"$LOGS/build.log" 2>&1
    build_rc=$?
  else
    tail -30 "$LOGS/configure.log"
  fi
  status_of build $build_rc
  # Warnings are not errors there (TESSERA_WERROR=OFF): count them, so a newer compiler's are seen.
  phase "build: exit $build_rc, $(grep -c 'warning:' "$LOGS/build.log" 2>/dev/null) compiler warnings (build.log)"
  if [[ $build_rc != 0 ]]; then
    phase "build failed (exit $build_rc); its last lines:"
    grep -E "error|Error" "$LOGS/build.log" | head -20
    tail -15 "$LOGS/build.log"
  fi
  CLI="$BUILD/app/cli/tessera-cli"
  TOOLS="$BUILD/tests/tools"
fi

snapshot
# And every 45 s while the suite and the benchmark run: a call killed at its limit loses at most
# that much.
# (A second's sleep at a time: killed, the loop ends within a second; its output goes nowhere,
# so nothing holds the caller's pipe open.)
( n=0; while sleep 1; do ((++n % 45 == 0)) && snapshot; done ) >/dev/null 2>&1 &
SNAPSHOTS=$!
trap 'kill $SNAPSHOTS 2>/dev/null' EXIT
if [[ $build_rc == 0 && $ONLY_BUILD == 0 ]] &&
  ! "$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>>"$LOGS/machine.err"; then
  # Every test would skip and pytest exit 0: a GPU that cannot be used is a failure of the check.
  phase "torch sees no CUDA GPU with this environment (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}): no suite"
  status_of cuda 1
elif [[ $build_rc == 0 && $ONLY_BUILD == 0 ]]; then
  # stderr apart: a warning there would make the JSON unreadable to the report.
  timeout 60 "$CLI" version --json >"$LOGS/version.json" 2>"$LOGS/version.err"
  timeout 90 "$CLI" profile --json --no-disk >"$LOGS/profile.json" 2>"$LOGS/profile.err"
  # The suite and the benchmark share what is left of the deadline: the benchmark keeps
  # BENCH_SECONDS, each test at most 150 s (pytest-timeout, where installed), so a hang costs one
  # test and not the report. The profile test measures rates and runs alone; the others in
  # parallel workers (pytest-xdist, where installed) on the one GPU.
  BENCH_SECONDS=$((BENCH == 1 ? 150 : 0))
  suite_seconds=$(left $((BENCH_SECONDS + 15)))
  ((suite_seconds > 360)) && suite_seconds=360
  extra=()
  "$PYTHON" -c "import pytest_timeout" 2>/dev/null && extra+=(--timeout 150)
  workers=()
  "$PYTHON" -c "import xdist" 2>/dev/null && workers=(-n "${TESSERA_GPU_WORKERS:-4}")
  phase "GPU parity suite (tests/gpu/test_gpu.py): ${suite_seconds} s, ${workers[*]:-one process} ${extra[*]}"
  suite() {  # suite NAME SECONDS PYTEST-ARGS...
    local name="$1" seconds="$2"
    shift 2
    if ((seconds < 30)); then
      phase "pytest-$name skipped: ${seconds} s left before the deadline"
      status_of "pytest-$name" skipped
      return
    fi
    # conftest.py writes a line per finished test there: a suite stopped at its limit keeps them.
    rm -f "$LOGS/pytest-$name.jsonl" "$LOGS/pytest-$name.jsonl.collected"
    TESSERA_CLI="$CLI" TESSERA_TOOLS_DIR="$TOOLS" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
      MKL_DYNAMIC=FALSE TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 \
      TESSERA_GPU_CHECK_RESULTS="$LOGS/pytest-$name.jsonl" OMP_NUM_THREADS="$THREADS" \
      XDG_CACHE_HOME="$BUILD/test-cache-$name" \
      timeout "$seconds" "$PYTHON" -m pytest -v -p no:cacheprovider -rA "${extra[@]}" \
      --junitxml="$LOGS/pytest-$name.xml" "$ROOT/tests/gpu/test_gpu.py" "$@" \
      >"$LOGS/pytest-$name.log" 2>&1
    local rc=$?
    # exit 5: no test selected (a --pytest-args -k that leaves none to this part)
    ((rc == 5)) && rc=0
    ((rc == 124)) && phase "pytest-$name stopped at its ${seconds} s"
    status_of "pytest-$name" $rc
    tail -3 "$LOGS/pytest-$name.log"
    snapshot
  }
  THREADS="$(nproc)"
  if [[ -n "$PYTEST_ARGS" ]]; then  # the caller's selection, in one process
    eval "chosen=($PYTEST_ARGS)"
    suite chosen "$suite_seconds" "${chosen[@]}"
  else
    suite_end=$((SECONDS + suite_seconds))
    THREADS="$(nproc)"  # the rates test measures the CPU Adam's: every core
    suite rates $((suite_seconds < 90 ? suite_seconds : 90)) -k "sees_the_gpu"
    # The busy-GPU tests share one module fixture (a 104M model and its run under single): on one
    # worker (their xdist_group, --dist loadgroup) it is built once.
    dist=()
    ((${#workers[@]} > 0)) && "$PYTHON" -c "from xdist.scheduler import LoadGroupScheduling" \
      2>/dev/null && dist=(--dist loadgroup)
    # The workers share the cores (each test's CPU runs too), not each take them all.
    THREADS=$(($(nproc) / (${#workers[@]} > 0 ? ${TESSERA_GPU_WORKERS:-4} : 1)))
    ((THREADS < 1)) && THREADS=1
    suite parity $((suite_end - SECONDS)) -k "not sees_the_gpu" "${workers[@]}" "${dist[@]}"
  fi
  if [[ $BENCH == 1 ]]; then
    bench_seconds=$(left 10)
    if ((bench_seconds < 30)); then
      phase "benchmark skipped: ${bench_seconds} s left before the deadline"
      status_of bench skipped
    else
      phase "benchmark (tests/gpu/bench_gpu.py): ${bench_seconds} s"
      TESSERA_CLI="$CLI" TESSERA_TOOLS_DIR="$TOOLS" PYTHONUNBUFFERED=1 \
        XDG_CACHE_HOME="$BUILD/test-cache" timeout "$bench_seconds" "$PYTHON" \
        "$ROOT/tests/gpu/bench_gpu.py" --json "$LOGS/bench.json" --traces "$LOGS" \
        >"$LOGS/bench.log" 2>&1
      bench_rc=$?
      # bench.json is written part by part: stopped at its limit, it holds the parts done.
      ((bench_rc == 124)) && phase "benchmark stopped at its ${bench_seconds} s (bench.json holds the parts done)"
      status_of bench $bench_rc
      tail -5 "$LOGS/bench.log"
    fi
  fi
fi
phase "done: writing the report"
kill $SNAPSHOTS 2>/dev/null
wait $SNAPSHOTS 2>/dev/null
snapshot
rm -f "$REPORT"/*.tmp  # a snapshot the loop was writing when it was stopped
[[ -s "$LOGS/report.err" ]] && tail -5 "$LOGS/report.err"
cat "$REPORT/report.md"
grep -qv "=0$" "$LOGS/status.txt" && exit 1
exit 0
