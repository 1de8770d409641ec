#!/usr/bin/env bash
# Installs a Tessera .deb into a clean Debian root and uses it there as a user would, then removes
# it: the package's own check (tests/installer/test_package.py runs it).
#
#   clean_root.sh DEB WORKDIR [CUDA_DEB]
#
# With CUDA_DEB (tessera-cuda), both are installed, and `tessera-cli version --json` is also run
# with TESSERA_CUDA=1 (load the CUDA module with no driver present) into cuda-version.json.
#
# The root is a minimal Debian (debootstrap --variant=minbase) of the release and from the
# mirror this machine's own apt sources name, made once and kept as a tarball under
# $TESSERA_HOME/debian-root (with the .deb files apt downloads into it, so later runs fetch
# nothing already fetched). It has no Python, no compiler and no build tree. In it: apt installs
# the .deb with its dependencies; `tessera-cli version` and the demo run to its accuracy line; the
# studio opens offscreen to a screenshot; apt purges the package and every file it installed must
# be gone. Needs root (chroot, mounts) and the network to the mirror.
set -euo pipefail
DEB="$(readlink -f "${1:?usage: clean_root.sh DEB WORKDIR}")"
WORK="$(readlink -f "${2:?usage: clean_root.sh DEB WORKDIR}")"
CUDA_DEB="${3:+$(readlink -f "$3")}"
TESSERA_HOME="${TESSERA_HOME:-$HOME/.cache/tessera}"
CACHE="$TESSERA_HOME/debian-root"
log() { printf '[clean-root %4ds] %s\n' "$SECONDS" "$*" >&2; }

# The release and mirror of this machine's apt sources (deb822 or one-line format).
release="$(. /etc/os-release && echo "$VERSION_CODENAME")"
mirror="$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)"
[[ -n "$mirror" ]] ||
  mirror="$(sed -n 's/^deb \(\[[^]]*\] \)\{0,1\}\([^ ]*\) .*/\2/p' /etc/apt/sources.list 2>/dev/null | head -n1)"
[[ -n "$release" && -n "$mirror" ]] || {
  echo "clean_root.sh: cannot tell this machine's Debian release and mirror" >&2
  exit 2
}
command -v debootstrap >/dev/null || {
  echo "clean_root.sh: debootstrap is not installed (installer/bootstrap.sh installs it)" >&2
  exit 2
}

mkdir -p "$CACHE/archives"
TARBALL="$CACHE/$release-minbase.tar"
if [[ ! -f "$TARBALL" ]]; then
  log "making a minimal $release root from $mirror (once; a few minutes)"
  fresh="$(mktemp -d "$CACHE/make.XXXXXX")"
  debootstrap --variant=minbase "$release" "$fresh/root" "$mirror" >"$CACHE/debootstrap.log" 2>&1 || {
    tail -20 "$CACHE/debootstrap.log" >&2
    rm -rf "$fresh"
    exit 1
  }
  tar -C "$fresh/root" -cf "$TARBALL.partial" .
  mv "$TARBALL.partial" "$TARBALL"
  rm -rf "$fresh"
fi

ROOT="$WORK/root"
mkdir -p "$ROOT"
tar -C "$ROOT" -xf "$TARBALL"
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  # The root goes only once nothing is mounted in it (/dev is bound there while it runs), and
  # never across a file system boundary.
  if ! grep -q " $ROOT[/ ]" /proc/mounts; then rm -rf --one-file-system "$ROOT"; fi
}
trap cleanup EXIT
bind() {
  mkdir -p "$ROOT$2"
  mount --bind "$1" "$ROOT$2"
  mounted+=("$ROOT$2")
}
mount -t proc proc "$ROOT/proc" && mounted+=("$ROOT/proc")
bind /dev /dev
bind "$CACHE/archives" /var/cache/apt/archives
mkdir -p "$ROOT/var/cache/apt/archives/partial"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# The machine's own apt sources replace the ones debootstrap wrote.
rm -f "$ROOT/etc/apt/sources.list"
cp /etc/apt/sources.list.d/*.sources "$ROOT/etc/apt/sources.list.d/" 2>/dev/null || true
if [[ -f /etc/apt/sources.list ]]; then cp /etc/apt/sources.list "$ROOT/etc/apt/sources.list"; fi
cp "$DEB" "$ROOT/tmp/tessera.deb"
debs=(/tmp/tessera.deb)
packages=(tessera)
if [[ -n "$CUDA_DEB" ]]; then
  cp "$CUDA_DEB" "$ROOT/tmp/tessera-cuda.deb"
  debs+=(/tmp/tessera-cuda.deb)
  packages+=(tessera-cuda)
fi
in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }

if in_root sh -c 'command -v python3 || command -v python || command -v cc'; then
  echo "clean_root.sh: the root has a Python or a compiler" >&2
  exit 1
fi
log "apt installs ${packages[*]} and the dependencies"
in_root apt-get update -qq
in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "${debs[@]}" >"$WORK/apt-install.log" 2>&1 || {
  tail -30 "$WORK/apt-install.log" >&2
  exit 1
}
rm -f "$ROOT"/tmp/tessera*.deb
for package in "${packages[@]}"; do in_root dpkg -L "$package"; done >"$WORK/files.txt"

log "tessera-cli version, the demo and the studio in the root"
in_root tessera-cli version >"$WORK/version.txt"
if [[ -n "$CUDA_DEB" ]]; then
  in_root env TESSERA_CUDA=1 tessera-cli version --json >"$WORK/cuda-version.json"
fi
in_root tessera-cli demo --steps 40 --out /root/demo >"$WORK/demo.txt" 2>&1
install -d -m 0700 "$ROOT/tmp/runtime"
in_root env QT_QPA_PLATFORM=offscreen XDG_RUNTIME_DIR=/tmp/runtime tessera --screenshot /root/first.png \
  >"$WORK/studio.txt" 2>&1
cp "$ROOT/root/first.png" "$WORK/first.png"

log "apt purges ${packages[*]}"
in_root env DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${packages[@]}" >"$WORK/apt-purge.log" 2>&1
left=()
while read -r path; do
  [[ -f "$ROOT$path" || -L "$ROOT$path" ]] && left+=("$path")
done <"$WORK/files.txt"
[[ ! -d "$ROOT/usr/lib/tessera" ]] || left+=(/usr/lib/tessera)
if ((${#left[@]})); then
  printf 'clean_root.sh: left after purge: %s\n' "${left[@]}" >&2
  exit 1
fi
# The user's data stays: what the demo wrote.
[[ -f "$ROOT/root/demo/run/model/config.json" ]] || {
  echo "clean_root.sh: the demo's output is gone after the purge" >&2
  exit 1
}
log "done"
