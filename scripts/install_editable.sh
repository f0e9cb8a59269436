#!/usr/bin/env bash
# Install sglang-feather (editable, no deps) into a venv, compiling the Chunked Hash Tree at most once per checkout: the
# module lands next to the sources (sglang_feather/cht/_native) and every venv here runs the same Python, so a
# module another venv's install built, for this Python's ABI and newer than every native source, is kept
# (SGLANG_FEATHER_NATIVE=OFF skips the build; CMakeLists.txt). A lock serialises concurrent installs
# (`make -j3 setup`), so no install rewrites the module while another builds or imports it.
#   scripts/install_editable.sh VENV_DIR [PIP_OPTION...]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
V=$1
shift
NATIVE="$ROOT/sglang_feather/cht/_native"
SUFFIX=$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
MODULE="$NATIVE/_tree$SUFFIX"

mkdir -p "$ROOT/build"
exec 9>"$ROOT/build/.native-install.lock"
flock 9
newer=""
if [ -f "$MODULE" ]; then
  newer=$(find "$ROOT/CMakeLists.txt" "$NATIVE" -maxdepth 1 -type f \
    \( -name CMakeLists.txt -o -name '*.cmake' -o -name '*.cpp' -o -name '*.h' \) -newer "$MODULE" -print -quit)
fi
if [ -f "$MODULE" ] && [ -z "$newer" ] && [ -z "${SGLANG_FEATHER_NATIVE:-}" ]; then
  echo "sglang-feather: reusing the compiled Chunked Hash Tree built for this Python ($MODULE)"
  SGLANG_FEATHER_NATIVE=OFF "$V/bin/python" -m pip --disable-pip-version-check -q install --no-compile "$@" --no-deps -e "$ROOT"
else
  "$V/bin/python" -m pip --disable-pip-version-check -q install --no-compile "$@" --no-deps -e "$ROOT"
  # A failed build installs nothing, which in a checkout leaves the previous module in place: remove it if it
  # is older than the sources, so the Python tree runs (with its warning) instead of code the sources no
  # longer say, and the setup scripts' final NativeTree import fails loudly.
  if [ -n "$newer" ] && [ -f "$MODULE" ] && [ -n "$(find "$ROOT/CMakeLists.txt" "$NATIVE" -maxdepth 1 -type f \
      \( -name CMakeLists.txt -o -name '*.cmake' -o -name '*.cpp' -o -name '*.h' \) -newer "$MODULE" -print -quit)" ]; then
    echo "sglang-feather: the compiled Chunked Hash Tree did not rebuild (see the warnings above); removing the stale $MODULE" >&2
    rm -f "$MODULE"
  fi
fi
