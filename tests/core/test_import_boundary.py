"""The core (cht, policy, sim, admission, workload) never imports torch, sglang or vllm, not even lazily."""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "sglang_feather"
CORE = ["cht", "policy", "sim", "admission.py", "options.py", "types.py", "workload.py"]
ENGINES = {"torch", "sglang", "vllm", "triton"}


def core_files():
    for entry in CORE:
        path = ROOT / entry
        yield from sorted(path.rglob("*.py")) if path.is_dir() else [path]


@pytest.mark.parametrize("path", list(core_files()), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_source_has_no_engine_import(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        for name in names:
            assert name.split(".")[0] not in ENGINES, f"{path.name}:{node.lineno} imports {name}"


def test_importing_core_loads_no_engine():
    code = (
        "import sys, importlib\n"
        "for m in ['sglang_feather.cht', 'sglang_feather.policy', 'sglang_feather.admission', "
        "'sglang_feather.options', 'sglang_feather.sim', 'sglang_feather.workload']:\n"
        "    importlib.import_module(m)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {sorted(ENGINES)!r})\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
