#!/usr/bin/env bash
# Builds Tessera's relocatable tarball: tessera-cli and the studio with the LibTorch and Arrow
# libraries they run on, for a machine with no Python, no compiler and no build tree.
#
#   installer/package.sh [--out DIR] [--no-build] [--cuda]
#     --no-build  pack what the build folder holds (nothing installed or built first)
#     --cuda      also pack tessera-cuda (below): for machines with an NVIDIA GPU
#
# Output, in DIR (default: dist/ in the checkout): a tarball and a Debian package.
#   tessera-VERSION-linux-x86_64.tar.gz   unpacks to tessera-VERSION/:
#     bin/tessera-cli, bin/tessera (the studio)
#     lib/tessera/  LibTorch's CPU libraries (libtorch_cpu, libc10, its OpenMP runtime and the
#                   two small CUDA libraries libtorch_cpu links), Arrow and Parquet (for Parquet
#                   datasets); the programs find them through an $ORIGIN-relative RPATH, so the
#                   folder runs from anywhere, a path with spaces included
#     DEPENDENCIES  the Debian packages it needs (Qt 6, SQLite, curl, ...): apt-get install them
#     README        the above, and how to run it
#   tessera_VERSION_amd64.deb   the same in /usr/bin and /usr/lib/tessera, depending on the
#     Debian packages of DEPENDENCIES, with a desktop entry, icons (hicolor, 16-512 px), AppStream
#     metadata, the MIME type application/x-tessera-job (*.tessera-job.json opens in the studio)
#     and man pages tessera-cli(1) and tessera(1) made from their --help
#   The CUDA module and LibTorch's CUDA libraries (several GB) are in neither: with these alone
#   `tessera-cli version` says the CUDA module is not installed, and everything runs on the CPU.
# With --cuda, also (about 3.5 GB unpacked; packing takes a few minutes):
#   tessera-cuda-VERSION-linux-x86_64.tar.gz  unpacks to tessera-VERSION/lib/tessera/: Tessera's
#     CUDA module (libtessera_cuda.so), LibTorch's CUDA libraries and the NVIDIA libraries they
#     load (cuBLAS, cuDNN, NCCL, ...); unpack it where the first tarball was unpacked
#   tessera-cuda_VERSION_amd64.deb  the same in /usr/lib/tessera, depending on tessera (= VERSION)
#   The programs load the module at start where an NVIDIA driver is (libcuda.so.1); the driver
#   itself is the system's.
#
# It installs what building needs (installer/bootstrap.sh --for package: the product's packages
# and patchelf), builds tessera-cli and the studio (as installer/demo.sh does), and packs.
#   TESSERA_BUILD_DIR  the build folder (default: build/ in the checkout)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/dist"
BUILD_FIRST=1
WITH_CUDA=0
while (($#)); do
  case "$1" in
    --cuda)
      WITH_CUDA=1
      shift
      ;;
    --no-build)
      BUILD_FIRST=0
      shift
      ;;
    --out)
      OUT="${2:?--out needs a folder}"
      shift 2
      ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "package.sh: unknown argument \"$1\" (see --help)" >&2
      exit 2
      ;;
  esac
done
source "$ROOT/installer/env.sh"
START=$SECONDS
phase() { printf '[package %4ds] %s\n' "$((SECONDS - START))" "$*" >&2; }

if ((BUILD_FIRST)); then
  phase "installing what building needs (installer/bootstrap.sh --for package)"
  bash "$ROOT/installer/bootstrap.sh" --for package
  phase "building tessera-cli and the studio in $BUILD_DIR"
  tessera_configure_and_build tessera-cli tessera
fi
CUDA_MODULE="$BUILD_DIR/engine/libtessera_cuda.so"
if ((WITH_CUDA)) && [[ ! -f "$CUDA_MODULE" ]]; then
  echo "package.sh: --cuda, but $CUDA_MODULE is not built (the build needs the CUDA toolkit and TESSERA_WITH_CUDA on)" >&2
  exit 1
fi
for program in app/cli/tessera-cli app/studio/tessera; do
  if [[ ! -x "$BUILD_DIR/$program" ]]; then
    echo "package.sh: $BUILD_DIR/$program is not built (run without --no-build)" >&2
    exit 1
  fi
done
command -v patchelf >/dev/null || {
  echo "package.sh: patchelf is not installed (installer/bootstrap.sh --for package installs it)" >&2
  exit 1
}
VERSION="$(sed -n 's/^project(Tessera VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")"
NAME="tessera-$VERSION"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
STAGE="$WORK/$NAME"
mkdir -p "$STAGE/bin" "$STAGE/lib/tessera"
cp "$BUILD_DIR/app/cli/tessera-cli" "$BUILD_DIR/app/studio/tessera" "$STAGE/bin/"

# collect_libraries DEST SKIP FILE...: copies into DEST every library the FILEs load (ldd: the
# whole closure), but not the FILEs themselves, the system's or those the folder SKIP has ("":
# none), and records the system's in system_paths.
system_lib() { [[ "$1" == /lib/* || "$1" == /usr/lib/* || "$1" == /lib64/* ]]; }
declare -A system_paths=()
collect_libraries() {
  local dest="$1" skip="$2" file soname arrow path _
  shift 2
  declare -A found=()
  for file in "$@"; do
    while read -r soname arrow path _; do
      [[ "$arrow" == "=>" ]] || continue
      if [[ "$path" == "not" ]]; then
        echo "package.sh: $(basename "$file") needs $soname, which is not found" >&2
        exit 1
      fi
      if system_lib "$path"; then
        system_paths[$path]=1
      elif [[ -z "$skip" || ! -e "$skip/$soname" ]]; then
        found[$soname]="$path"
      fi
    done < <(ldd "$file")
  done
  for soname in "${!found[@]}"; do
    cp -L "${found[$soname]}" "$dest/$soname"
    chmod 0755 "$dest/$soname"
  done
}
# The libraries look beside themselves ($ORIGIN; LibTorch's already do, among paths of the
# wheel's layout that do not exist here).
rpath_to_origin() {
  local lib rpath
  for lib in "$1"/*; do
    rpath="$(patchelf --print-rpath "$lib")"
    [[ "$rpath" == *'$ORIGIN'* ]] || patchelf --set-rpath '$ORIGIN' "$lib"
  done
}
# debian_packages ELF...: the Debian packages of the system libraries these ELF files name (their
# NEEDED entries; apt brings what those need in turn), one a line: what the machine must have.
owner_of() {
  local p
  for p in "$@"; do
    dpkg -S "$p" 2>/dev/null | head -n1 | cut -d: -f1 | grep . && return 0
  done
  return 1
}
debian_packages() {
  local elf soname path real owner
  declare -A needed=()
  for elf in "$@"; do
    while read -r soname; do needed[$soname]=1; done < <(patchelf --print-needed "$elf")
  done
  for path in "${!system_paths[@]}"; do
    [[ -n "${needed[$(basename "$path")]:-}" ]] || continue
    real="$(readlink -f "$path")"
    if owner="$(owner_of "$path" "$real" "${real#/usr}" "/usr$path")"; then
      echo "$owner"
    else
      echo "package.sh: no Debian package owns $path" >&2
      exit 1
    fi
  done
}

# Every library the programs load that is not the system's (LibTorch's and Arrow's, from the
# venv's wheels) goes into lib/tessera; the system's become DEPENDENCIES.
phase "collecting the libraries the programs load"
collect_libraries "$STAGE/lib/tessera" "" "$STAGE"/bin/*
# The programs look beside them in ../lib/tessera.
for program in "$STAGE"/bin/*; do patchelf --set-rpath '$ORIGIN/../lib/tessera' "$program"; done
rpath_to_origin "$STAGE/lib/tessera"
debian_packages "$STAGE"/bin/* "$STAGE"/lib/tessera/* >"$WORK/packages"
mapfile -t packages <"$WORK/packages"
# Loaded at run time, so no NEEDED entry names it: Qt's SQLite driver (the studio's runs database).
packages+=(libqt6sql6-sqlite)
printf '%s\n' "${packages[@]}" | sort -u >"$STAGE/DEPENDENCIES"
cat >"$STAGE/README" <<EOF
Tessera $VERSION: the studio (bin/tessera) and tessera-cli (bin/tessera-cli), with the LibTorch
and Arrow libraries they run on (lib/tessera). No Python and no compiler are needed.

Install the Debian packages it uses (listed in DEPENDENCIES), then run it from this folder:
  sudo apt-get install \$(cat DEPENDENCIES)
  bin/tessera-cli demo      # fine-tunes a small model on generated data, on the CPU
  bin/tessera               # the studio

This folder alone runs on the CPU: it carries no CUDA module and none of LibTorch's CUDA
libraries. For an NVIDIA GPU, unpack tessera-cuda-$VERSION-linux-x86_64.tar.gz where this one was
unpacked (it adds them to lib/tessera); \`bin/tessera-cli version\` then says the module is loaded.
Remove it by deleting this folder; runs keep their data where you chose, the studio its own under
~/.local/share/Tessera.
EOF

mkdir -p "$OUT"
TARBALL="$OUT/$NAME-linux-x86_64.tar.gz"
phase "packing $(du -sh "$STAGE" | cut -f1) into $TARBALL (gzip -1: a minute or two)"
tar -C "$WORK" -cf - "$NAME" | gzip -1 >"$TARBALL.partial"
mv "$TARBALL.partial" "$TARBALL"

# The .deb: the same programs and libraries under /usr (bin/ and lib/tessera/, so the same
# $ORIGIN-relative RPATH), with the desktop's files. No maintainer scripts: Debian's triggers
# refresh the desktop, MIME and icon caches.
phase "laying out the Debian package"
DEB="$WORK/deb"
mkdir -p "$DEB/DEBIAN" "$DEB/usr/bin" "$DEB/usr/lib/tessera" "$DEB/usr/share/applications" \
  "$DEB/usr/share/metainfo" "$DEB/usr/share/mime/packages" "$DEB/usr/share/man/man1" \
  "$DEB/usr/share/doc/tessera"
cp -a "$STAGE/bin/." "$DEB/usr/bin/"
cp -a "$STAGE/lib/tessera/." "$DEB/usr/lib/tessera/"
SHARE="$ROOT/installer/share"
install -m 0644 "$SHARE/tessera.desktop" "$DEB/usr/share/applications/tessera.desktop"
install -m 0644 "$SHARE/io.tessera.Studio.metainfo.xml" "$DEB/usr/share/metainfo/"
install -m 0644 "$SHARE/tessera-job.xml" "$DEB/usr/share/mime/packages/tessera.xml"
QT_QPA_PLATFORM=offscreen HOME="$WORK" XDG_RUNTIME_DIR="$WORK" \
  "$STAGE/bin/tessera" --write-icons "$DEB/usr/share/icons/hicolor"
# Man pages from the programs' own --help (tessera-cli's and each of its commands').
roff() { sed -e 's/\\/\\e/g' -e "s/^\([.']\)/\\\\\&\1/"; }
{
  echo ".TH TESSERA-CLI 1 \"\" \"Tessera $VERSION\" \"User Commands\""
  echo ".SH NAME"
  echo "tessera-cli \\- fine-tune HuggingFace models from the command line"
  echo ".SH SYNOPSIS"
  echo ".B tessera-cli"
  echo "COMMAND [ARGS]"
  echo ".SH DESCRIPTION"
  echo ".nf"
  "$STAGE/bin/tessera-cli" --help | roff
  echo ".fi"
  echo ".SH COMMANDS"
  for command in $("$STAGE/bin/tessera-cli" --help | sed -n 's/^  \([a-z][a-z-]*\)  .*/\1/p'); do
    echo ".SS $command"
    echo ".nf"
    "$STAGE/bin/tessera-cli" "$command" --help 2>&1 | roff
    echo ".fi"
  done
  echo ".SH SEE ALSO"
  echo ".BR tessera (1)"
} | gzip -9n >"$DEB/usr/share/man/man1/tessera-cli.1.gz"
{
  echo ".TH TESSERA 1 \"\" \"Tessera $VERSION\" \"User Commands\""
  echo ".SH NAME"
  echo "tessera \\- Tessera Studio, the fine-tuning studio"
  echo ".SH SYNOPSIS"
  echo ".B tessera"
  echo "[options] [job]"
  echo ".SH DESCRIPTION"
  echo ".nf"
  QT_QPA_PLATFORM=offscreen HOME="$WORK" XDG_RUNTIME_DIR="$WORK" "$STAGE/bin/tessera" --help | roff
  echo ".fi"
  echo ".SH SEE ALSO"
  echo ".BR tessera-cli (1)"
} | gzip -9n >"$DEB/usr/share/man/man1/tessera.1.gz"
install -m 0644 "$STAGE/README" "$DEB/usr/share/doc/tessera/README"
INSTALLED_KIB=$(du -sk --exclude=DEBIAN "$DEB" | cut -f1)
cat >"$DEB/DEBIAN/control" <<EOF_CONTROL
Package: tessera
Version: $VERSION
Architecture: amd64
Maintainer: Tessera developers <tessera@localhost>
Installed-Size: $INSTALLED_KIB
Depends: $(paste -sd, "$STAGE/DEPENDENCIES" | sed 's/,/, /g')
Section: science
Priority: optional
Description: studio for fine-tuning HuggingFace models on this machine
 Tessera Studio (tessera) and tessera-cli fine-tune HuggingFace models, in full,
 with LoRA or QLoRA, or by preference tuning, on the CPU, across memory and disk,
 or over several machines on a LAN, and export checkpoints that transformers,
 peft and llama.cpp load. LibTorch's CPU libraries are included.
EOF_CONTROL
DEB_FILE="$OUT/tessera_${VERSION}_amd64.deb"
phase "packing the Debian package (zstd)"
dpkg-deb --root-owner-group -Zzstd --build "$DEB" "$DEB_FILE.partial" >/dev/null
mv "$DEB_FILE.partial" "$DEB_FILE"
phase "done: $TARBALL ($(du -h "$TARBALL" | cut -f1); unpacked $(du -sh "$STAGE" | cut -f1)) and $DEB_FILE ($(du -h "$DEB_FILE" | cut -f1); installed $((INSTALLED_KIB / 1024)) MiB)"
((WITH_CUDA)) || exit 0

# tessera-cuda: the module and every library it loads that the CPU package does not carry.
# LibTorch and cuDNN also open some of theirs by name while running (dlopen: cuDNN's engine
# libraries, NVRTC's builtins, LibTorch's CUDA linear algebra), so those are added by name.
CUDA_STAGE="$WORK/cuda/$NAME"
mkdir -p "$CUDA_STAGE/lib/tessera"
TORCH_LIB_SOURCE="$(dirname "$(ldd "$BUILD_DIR/app/cli/tessera-cli" | sed -n 's/.*libtorch_cpu.so => \([^ ]*\).*/\1/p')")"
phase "collecting the CUDA module and the libraries it loads (from $TORCH_LIB_SOURCE)"
cuda_roots=("$CUDA_MODULE" "$TORCH_LIB_SOURCE/libtorch_cuda_linalg.so")
[[ "$(ldd "$CUDA_MODULE")" == *"libtorch_cuda.so => /"* ]] || {
  echo "package.sh: $CUDA_MODULE does not load libtorch_cuda.so (ldd)" >&2
  exit 1
}
for opened_by_name in "$TORCH_LIB_SOURCE"/../../nvidia/cudnn/lib/libcudnn*.so.* \
  "$TORCH_LIB_SOURCE"/../../nvidia/cu*/lib/libnvrtc-builtins*.so*; do
  [[ -f "$opened_by_name" ]] && cuda_roots+=("$(readlink -f "$opened_by_name")")
done
system_paths=()
collect_libraries "$CUDA_STAGE/lib/tessera" "$STAGE/lib/tessera" "${cuda_roots[@]}"
# The roots themselves (collect_libraries copies what they load).
for root in "${cuda_roots[@]}"; do
  [[ -e "$STAGE/lib/tessera/$(basename "$root")" ]] || cp -L "$root" "$CUDA_STAGE/lib/tessera/"
done
chmod 0755 "$CUDA_STAGE"/lib/tessera/*
rpath_to_origin "$CUDA_STAGE/lib/tessera"
debian_packages "$CUDA_STAGE"/lib/tessera/* >"$WORK/cuda-packages"
mapfile -t cuda_packages <"$WORK/cuda-packages"

CUDA_TARBALL="$OUT/tessera-cuda-$VERSION-linux-x86_64.tar.gz"
phase "packing $(du -sh "$CUDA_STAGE" | cut -f1) into $CUDA_TARBALL (gzip -1: a few minutes)"
tar -C "$WORK/cuda" -cf - "$NAME" | gzip -1 >"$CUDA_TARBALL.partial"
mv "$CUDA_TARBALL.partial" "$CUDA_TARBALL"

CUDA_DEB="$WORK/deb-cuda"
mkdir -p "$CUDA_DEB/DEBIAN" "$CUDA_DEB/usr/lib" "$CUDA_DEB/usr/share/doc/tessera-cuda"
mv "$CUDA_STAGE/lib/tessera" "$CUDA_DEB/usr/lib/tessera"
cat >"$CUDA_DEB/usr/share/doc/tessera-cuda/README" <<EOF_README
Tessera $VERSION's CUDA module and the CUDA libraries it runs on (LibTorch's and NVIDIA's), in
/usr/lib/tessera. tessera-cli and the studio load it at start on a machine with an NVIDIA driver
(libcuda.so.1, the system's); \`tessera-cli version\` says whether it is loaded.
EOF_README
CUDA_INSTALLED_KIB=$(du -sk --exclude=DEBIAN "$CUDA_DEB" | cut -f1)
cuda_depends="tessera (= $VERSION)"
for package in $(printf '%s\n' "${cuda_packages[@]}" | sort -u); do cuda_depends+=", $package"; done
cat >"$CUDA_DEB/DEBIAN/control" <<EOF_CONTROL
Package: tessera-cuda
Version: $VERSION
Architecture: amd64
Maintainer: Tessera developers <tessera@localhost>
Installed-Size: $CUDA_INSTALLED_KIB
Depends: $cuda_depends
Section: science
Priority: optional
Description: NVIDIA GPU support for Tessera
 Tessera's CUDA module with LibTorch's CUDA libraries and the NVIDIA libraries
 they load (CUDA runtime, cuBLAS, cuDNN, NCCL, ...), so that tessera-cli and the
 studio train on NVIDIA GPUs. Needs the NVIDIA driver.
EOF_CONTROL
CUDA_DEB_FILE="$OUT/tessera-cuda_${VERSION}_amd64.deb"
phase "packing the CUDA Debian package (zstd)"
dpkg-deb --root-owner-group -Zzstd --threads-max="$(nproc)" --build "$CUDA_DEB" "$CUDA_DEB_FILE.partial" >/dev/null
mv "$CUDA_DEB_FILE.partial" "$CUDA_DEB_FILE"
phase "done: $CUDA_TARBALL ($(du -h "$CUDA_TARBALL" | cut -f1)) and $CUDA_DEB_FILE ($(du -h "$CUDA_DEB_FILE" | cut -f1); installed $((CUDA_INSTALLED_KIB / 1024)) MiB)"
