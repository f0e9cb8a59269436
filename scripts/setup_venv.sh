#!/usr/bin/env bash
# Create or update .venv: sglang-feather (editable) + SGLang 0.5.23 (--no-deps, hand-picked deps) + CPU torch 2.13.0
# + the CPU test scaffolding (scaffold/cpu). Idempotent: an existing venv is updated in place, and `make setup`
# skips this script entirely when none of its inputs changed.
# Usage: scripts/setup_venv.sh [VENV_DIR]   (default .venv)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
V=${1:-.venv}
PY=${PYTHON:-python3}

if [ -e "$V" ] && [ ! -f "$V/pyvenv.cfg" ]; then
  echo "refusing to use $V: it exists and is not a venv" >&2
  exit 1
fi
[ -f "$V/pyvenv.cfg" ] || "$PY" -m venv "$V"
PIP=("$V/bin/python" -m pip --disable-pip-version-check -q)
# No byte-compiling at install: Python compiles what it imports on first import, a fraction of the files.
INSTALL=("${PIP[@]}" install --no-compile)
C=(-c "$ROOT/requirements/constraints.txt")

# torch first, by exact version: the CPU build on these machines. The constraint file keeps every later
# step from swapping it for a CUDA build.
"${INSTALL[@]}" "${C[@]}" torch==2.13.0
"${INSTALL[@]}" "${C[@]}" -r "$ROOT/requirements/sglang-cpu.txt" -r "$ROOT/requirements/dev.txt"
# SGLang and torchvision without their dependency pins (CUDA kernels, torch 2.14.1).
"${INSTALL[@]}" --no-deps sglang==0.5.23 torchvision==0.28.0
# Editable install; its build (scikit-build-core + nanobind + CMake, fetched into an isolated build env)
# compiles the Chunked Hash Tree into sglang_feather/cht/_native next to the sources, once per checkout (install_editable.sh).
bash "$ROOT/scripts/install_editable.sh" "$V" "${C[@]}"

# CPU test scaffolding: scaffold/cpu on sys.path (stub sgl_kernel) and the torchvision import shim; every
# path relative, so the venv survives moving the checkout.
bash "$ROOT/scripts/relocatable.sh" "$V" SCAFFOLD

"$V/bin/python" - <<'PY'
import torch, sglang, sglang_feather
from sglang.srt.managers.schedule_policy import SchedulePolicy  # noqa: F401  (imports torchvision too)
from sglang_feather.cht import backend_name
from sglang_feather.cht.native import NativeTree  # noqa: F401  (fails loudly if the compiled tree is missing)
assert "+cpu" in torch.__version__, f"expected the CPU build of torch, got {torch.__version__}"
print(f"venv ready: torch {torch.__version__}, sglang {sglang.__version__}, sglang_feather {sglang_feather.__version__}, "
      f"CHT backend {backend_name()}")
PY
