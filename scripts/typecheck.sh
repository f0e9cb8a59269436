#!/usr/bin/env bash
# Type-check all of sglang_feather with mypy (pyproject.toml [tool.mypy]) inside the venvs `make setup` built, so
# SGLang, torch and vLLM resolve to the installed versions: the vLLM side (the adapter package and the vLLM
# harness modules, VLLM_SIDE) in the vLLM venv, every other module in the SGLang venv. Each run names its own
# files and follows imports into the other side's modules silently (no venv holds both engines; each module's
# errors are reported by the run that names it). The compiled Chunked Hash Tree is a binary mypy cannot read: its stub
# is written first from the built module by nanobind's stubgen (private members too: the Python wrapper
# calls them), into build/typecheck-stubs (mypy_path).
# Usage: scripts/typecheck.sh [VENV] [VENV_VLLM]   (defaults .venv .venv-vllm; `make typecheck`)
set -euo pipefail
cd "$(dirname "$0")/.."
V=${1:-.venv}
V_VLLM=${2:-.venv-vllm}
VLLM_SIDE=(
  sglang_feather/vllm
  sglang_feather/offline/vllm_admission.py
  sglang_feather/offline/vllm_harness.py
  sglang_feather/offline/vllm_metrics.py
  sglang_feather/bench/vllm_admission.py
)

"$V/bin/python" -m nanobind.stubgen -q -P -m sglang_feather.cht._native._tree \
  -o build/typecheck-stubs/sglang_feather/cht/_native/_tree.pyi

excludes=()
for path in "${VLLM_SIDE[@]}"; do excludes+=(--exclude "^${path//./\\.}"); done
rc=0
echo "mypy in $V: sglang_feather except the vLLM side"
"$V/bin/python" -m mypy --follow-imports=silent --cache-dir .mypy_cache/sglang "${excludes[@]}" sglang_feather || rc=1
echo "mypy in $V_VLLM: the vLLM side"
"$V_VLLM/bin/python" -m mypy --follow-imports=silent --cache-dir .mypy_cache/vllm \
  "${VLLM_SIDE[@]}" || rc=1
exit $rc
