"""The import boundary, read from every module's AST (imports at module level and inside functions alike).

- No module imports a project or engine module by a string (`importlib.import_module`, `__import__`).
- The core (`cht`, `policy`, `admission`) imports no engine and no tooling, and of the project only the core,
  `options` and `types`.
- Runtime modules (the core, `options`, `types`, the `sglang` and `vllm` adapters) reach no tooling (`sim`,
  `bench`, `offline`, `serving`, `demo`), following every import, lazy ones included.
- The adapters reach their engine only through an import inside a function: importing an adapter package or
  the SGLang plugin entry point runs no engine import (modules that subclass engine classes import it at
  module level, and are themselves imported only inside functions).
- Every name imported from a project module exists there.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "sglang_feather"
REPO = Path(__file__).resolve().parents[2]
ENGINES = frozenset({"torch", "sglang", "vllm", "triton"})
CORE = frozenset({"cht", "policy", "admission"})
RUNTIME = CORE | {"options", "types", "sglang", "vllm"}
ADAPTERS = frozenset({"sglang", "vllm"})
TOOLING = frozenset({"sim", "bench", "offline", "serving", "demo"})
ENGINE_FREE = ("cht", "policy", "admission", "options", "types", "workload", "sim", "bench", "sglang", "vllm")
"""Packages and modules whose import (module-level imports only, followed) loads no engine."""


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    lazy: bool
    """Inside a function, or under `if TYPE_CHECKING:`: not run when the source module is imported."""


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((REPO / PACKAGE).rglob("*.py"))}
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def area(name: str) -> str:
    """`sglang_feather.sim.engine` -> `sim`; `sglang_feather` -> ''; another package -> ''."""
    parts = name.split(".")
    return parts[1] if parts[0] == PACKAGE and len(parts) > 1 else ""


def resolve(name: str) -> str:
    """The project module `name` denotes (the longest prefix that is one), or `name` if not in the project."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in MODULES:
            return ".".join(parts[:end])
    return name


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _walk(node: ast.AST, lazy: bool = False):
    for child in ast.iter_child_nodes(node):
        child_lazy = (
            lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) or _is_type_checking(child)
        )
        yield child, lazy
        yield from _walk(child, child_lazy)


def edges(source: str) -> list[Edge]:
    package = source if MODULES[source].name == "__init__.py" else source.rpartition(".")[0]
    found = []
    for node, lazy in _walk(TREES[source]):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [resolve(f"{base}.{alias.name}") for alias in node.names]
        else:
            continue
        found += [Edge(source, resolve(t), node.lineno, lazy) for t in targets]
    return found


EDGES = {name: edges(name) for name in MODULES}


def packages(name: str) -> list[str]:
    """`name` and the packages above it, whose `__init__` an import of `name` runs first."""
    parts = name.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts) + 1)]


def reach(start: str, follow_lazy: bool) -> dict[str, list[Edge]]:
    """Every module reachable from `start`, each with the chain of imports that reaches it first."""
    chains: dict[str, list[Edge]] = {name: [] for name in packages(start)}
    queue = deque(chains)
    while queue:
        name = queue.popleft()
        for edge in EDGES.get(name, ()):
            if not follow_lazy and edge.lazy:
                continue
            for target in packages(edge.target):
                if target not in chains:
                    chains[target] = [*chains[name], Edge(edge.source, target, edge.line, edge.lazy)]
                    queue.append(target)
    return chains


def show(chain: list[Edge]) -> str:
    return " -> ".join(
        f"{e.source}:{e.line} imports {e.target}{' (lazily)' if e.lazy else ''}" for e in chain
    )


def dynamic_imports(source: str) -> list[str]:
    """Imports by a computed name or a string naming a project or engine module, as `module:line call`."""
    found = []
    for node in ast.walk(TREES[source]):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called not in ("import_module", "__import__"):
            continue
        arg = node.args[0] if node.args else None
        named = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
        if named is None or named.split(".")[0] in ENGINES | {PACKAGE}:
            found.append(f"{source}:{node.lineno} {ast.unparse(node)}")
    return found


def defined_names(source: str) -> set[str] | None:
    """Names bound at the top level of a module (through `if`/`try`/`with` too); None if it has `__getattr__`."""
    names: set[str] = set()
    stack = list(TREES[source].body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            stack += [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]
            stack += [s for handler in getattr(node, "handlers", []) for s in handler.body]
    return None if "__getattr__" in names else names


def plugin_entry_points() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [value.split(":")[0] for value in project["entry-points"]["sglang.srt.plugins"].values()]


@pytest.mark.parametrize("source", sorted(MODULES))
def test_no_module_imports_a_project_or_engine_module_by_a_string(source):
    assert not dynamic_imports(source), "import it with an import statement (inside a function if lazy)"


@pytest.mark.parametrize("source", sorted(n for n in MODULES if area(n) in CORE))
def test_core_imports_no_engine_no_tooling_and_no_adapter(source):
    for edge in EDGES[source]:
        assert edge.target.split(".")[0] not in ENGINES, show([edge])
        if edge.target.startswith(PACKAGE):
            assert area(edge.target) in RUNTIME - ADAPTERS, show([edge])


@pytest.mark.parametrize("source", sorted(n for n in MODULES if area(n) in RUNTIME))
def test_runtime_modules_reach_no_tooling_even_lazily(source):
    for target, chain in reach(source, follow_lazy=True).items():
        assert area(target) not in TOOLING, show(chain)


@pytest.mark.parametrize(
    "start", sorted({f"{PACKAGE}.{a}" for a in ENGINE_FREE} | set(plugin_entry_points()))
)
def test_importing_reaches_an_engine_only_inside_a_function(start):
    for target, chain in reach(start, follow_lazy=False).items():
        assert target.split(".")[0] not in ENGINES, show(chain)


def is_submodule(package: str, name: str) -> bool:
    """A Python submodule, or a compiled extension (`_core`) built from the C++ sources in the package."""
    directory = MODULES[package].parent
    compiled = name.startswith("_") and any(directory.glob("*.cpp"))
    return f"{package}.{name}" in MODULES or (MODULES[package].name == "__init__.py" and compiled)


@pytest.mark.parametrize("source", sorted(MODULES))
def test_every_name_imported_from_a_project_module_exists(source):
    for node, _lazy in _walk(TREES[source]):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in MODULES:
            defined = defined_names(node.module)
            for alias in node.names:
                exists = defined is None or alias.name in defined or is_submodule(node.module, alias.name)
                assert exists, (
                    f"{source}:{node.lineno} imports {alias.name} from {node.module}, not defined there"
                )


def test_importing_the_engine_free_modules_loads_no_engine():
    modules = [f"{PACKAGE}.{a}" for a in ENGINE_FREE] + plugin_entry_points()
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {sorted(ENGINES)!r})\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
