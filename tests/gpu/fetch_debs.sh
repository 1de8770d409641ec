#!/usr/bin/env bash
# Fills build-gpu/deps/ (ignored by git, beside the GPU check's build) with the Debian packages that tests/gpu/run.sh unpacks into a
# prefix on a lent GPU machine, which has no package registry: the headers and libraries the
# engine and tessera-cli build against when built without Qt and the Hub (PCRE2, xxHash, ICU,
# nlohmann-json, Gloo's headers, OpenSSL for the LAN nodes) and pkg-config. Run it here, then
# name build-gpu/deps in the device call's carry. About 20 MB. Idempotent.
#
#   bash tests/gpu/fetch_debs.sh [--list]     (--list: print the packages and exit)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="$ROOT/build-gpu/deps"
PACKAGES=(
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libxxhash-dev libxxhash0
  libicu-dev libicu72
  nlohmann-json3-dev
  libgloo-dev
  libssl-dev libssl3
  pkgconf pkgconf-bin libpkgconf3
)
if [[ "${1:-}" == "--list" ]]; then
  printf '%s\n' "${PACKAGES[@]}"
  exit 0
fi
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
  sed -n '2,8p' "$0"
  exit 0
fi
mkdir -p "$DEST"
git -C "$ROOT" check-ignore -q "$DEST" 2>/dev/null || {
  echo "fetch_debs: $DEST must be ignored by git (.gitignore: /build*/)" >&2
  exit 1
}
cd "$DEST"
missing=()
for p in "${PACKAGES[@]}"; do
  compgen -G "${p}_*.deb" >/dev/null || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "fetch_debs: downloading ${missing[*]}" >&2
  apt-get download "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -qq && apt-get download "${missing[@]}"
  }
fi
du -sh "$DEST" | awk '{print "fetch_debs: " $1 " in " $2}' >&2
