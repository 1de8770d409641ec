#!/usr/bin/env bash
# Runs a Qt test (argv) on the xcb platform under its own Xvfb server, so it can drive the real
# window with X input (xdotool) as a person would. Xvfb picks a free display (-displayfd); the
# server is stopped however the test ends. Exits 77 (ctest's SKIP_RETURN_CODE for the test) when
# Xvfb or xdotool is missing, saying which.
set -euo pipefail

readonly skip_code=77
for tool in Xvfb xdotool; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIP: $tool is not installed (installer/bootstrap.sh installs it)" >&2
    exit "$skip_code"
  fi
done

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/tessera-xvfb.XXXXXX")
xvfb_pid=""
stop_xvfb() {
  if [[ -n "$xvfb_pid" ]] && kill -0 "$xvfb_pid" 2>/dev/null; then
    kill "$xvfb_pid" 2>/dev/null || true
    wait "$xvfb_pid" 2>/dev/null || true
  fi
  rm -rf "$run_dir"
}
trap stop_xvfb EXIT

# -displayfd writes the display number it chose to the fd once the server accepts clients.
# -terminate: the server also ends when its last client (the test) goes, so a wrapper killed
# with SIGKILL (ctest's timeout) leaves no server behind.
mkfifo "$run_dir/display"
Xvfb -displayfd 3 -screen 0 1600x1000x24 -nolisten tcp -terminate \
  3>"$run_dir/display" 2>"$run_dir/xvfb.log" &
xvfb_pid=$!
display=""
if ! read -r -t 30 display <"$run_dir/display" || [[ -z "$display" ]]; then
  echo "Xvfb did not start within 30 s:" >&2
  cat "$run_dir/xvfb.log" >&2
  exit 1
fi

export DISPLAY=":$display"
export QT_QPA_PLATFORM=xcb
unset WAYLAND_DISPLAY
echo "Xvfb on $DISPLAY (pid $xvfb_pid)"
status=0
"$@" || status=$?
exit "$status"
