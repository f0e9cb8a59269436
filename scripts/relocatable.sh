#!/usr/bin/env bash
# Make a venv inside the checkout survive moving the checkout: its sglang-feather and scaffold .pth entries
# become paths relative to site-packages (Python's site module joins a relative .pth line to the site dir),
# and the editable finder, which records absolute paths, goes. The compiled tree is built next to the
# sources, and the package's metadata (the SGLang plugin entry point) holds no path.
#   scripts/relocatable.sh VENV_DIR [SCAFFOLD]   (SCAFFOLD: also write the CPU scaffold's .pth)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
V=$1
SP=$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
REL=$("$V/bin/python" -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$ROOT" "$SP")
shopt -s nullglob
for pth in "$SP"/__editable__*sglang_feather*.pth; do
  printf '%s\n' "$REL" > "$pth"
done
rm -f "$SP"/__editable___sglang_feather*_finder.py
if [ "${2:-}" = SCAFFOLD ]; then
  printf '%s\nimport _tv_cpu_shim\n' "$REL/scaffold/cpu" > "$SP/feather_cpu_scaffold.pth"
fi
"$V/bin/python" -c 'import sglang_feather, os, sys
root = os.path.dirname(os.path.dirname(os.path.abspath(sglang_feather.__file__)))
assert os.path.samefile(root, sys.argv[1]), (root, sys.argv[1])' "$ROOT"
