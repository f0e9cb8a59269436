"""The import boundary, read from every module's AST (imports at module level, inside functions and under
`if TYPE_CHECKING:` alike).

- The package's layers and what each may import are one table (`MAY_IMPORT`): every module belongs to a layer
  (a subpackage, or a top-level module such as `demo.py`), every import between layers is listed there, and
  the table runs one way (no layer reaches itself through it), so no import goes back up.
- No import circle joins files of different folders; within a folder only the circles `KNOWN_CIRCLES` names.
- No module imports a project or engine module by a string (`importlib.import_module`, `__import__`).
- The core (`cht`, `policy`, `admission`) imports no engine (torch, SGLang, vLLM, Triton).
- Runtime modules (the core, `options`, `types`, the `sglang` and `vllm` adapters) reach no tooling (`sim`,
  `bench`, `measure`, `offline`, `serving`, the demos), following every import, lazy ones included.
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
ENGINE_FREE = (
    "cht", "policy", "admission", "options", "types", "workload", "measure", "sim", "bench", "sglang", "vllm"
)  # fmt: skip
"""Packages and modules whose import (module-level imports only, followed) loads no engine."""

MAY_IMPORT: dict[str, frozenset[str]] = {
    "": frozenset(),  # sglang_feather/__init__.py
    "types": frozenset(),
    "options": frozenset(),
    "cht": frozenset({"types"}),
    "policy": frozenset({"options", "types"}),
    "admission": frozenset({"cht", "policy", "options", "types"}),
    "workload": frozenset({"options"}),
    "sglang": CORE | {"options", "types"},
    "vllm": CORE | {"options", "types"},
    "patches": frozenset({"sglang"}),  # the supported release, declared once in sglang/version.py
    "measure": frozenset({"workload"}),
    "offline": CORE | {"options", "types", "workload", "measure", "sglang", "vllm"},
    "sim": CORE | {"options", "types", "workload", "offline"},
    "bench": CORE | {"options", "types", "workload", "measure", "offline", "sglang", "sim"},
    "serving": frozenset({"options", "workload"}),
    "demo": frozenset({"policy", "serving", "workload"}),
    "cluster_demo": frozenset({"demo", "serving", "workload"}),
}
"""Layer -> the layers its modules may import (any import, lazy or for type checking only). Bottom up: the
shared data types and declared options; the CHT, the stoppers and the admission component; the workload spec;
the engine adapters; then the tooling: `measure` (what both benchmark sides share), `offline` (real SGLang
objects on CPU and vLLM's model-free harness, driven by `sim` and `bench`), the simulator, the benchmarks
(`bench vllm-admission` replays the simulator's workload generators on vLLM's harness), the live-server harness and the
demos on top of it."""

KNOWN_CIRCLES = {
    frozenset({"sglang_feather.cht.invariants", "sglang_feather.cht.tree"}): (
        "the checker reads the tree's private state, typed as PythonTree; goes when the tree's parts own "
        "their state (issue 51, item 2)"
    ),
}
"""Import circles between files of one folder, tolerated until the change each names; no new one may appear."""


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


def folder(name: str) -> str:
    """The folder a module's file lies in: `sglang_feather.sim.engine` -> `sglang_feather.sim`."""
    return name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]


def circles(graph: dict[str, list[Edge]]) -> list[set[str]]:
    """The strongly connected sets of two or more modules of `graph` (module -> its imports, every one counted;
    Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            name, pending = work[-1]
            edge = next(pending, None)
            if edge is not None:
                target = edge.target
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    work.append((target, iter(graph[target])))
                elif target in stack:
                    low[name] = min(low[name], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[name])
            if low[name] == index[name]:
                members = set()
                while True:
                    member = stack.pop()
                    members.add(member)
                    if member == name:
                        break
                if len(members) > 1:
                    found.append(members)
    return found


def show_circle(members: set[str]) -> str:
    return "; ".join(show([e]) for m in sorted(members) for e in EDGES[m] if e.target in members)


def test_every_module_belongs_to_a_listed_layer():
    unlisted = sorted({area(name) for name in MODULES} - set(MAY_IMPORT))
    assert not unlisted, f"add these to MAY_IMPORT, with the layers they may import: {unlisted}"


def test_the_layers_run_one_way():
    for start in MAY_IMPORT:
        seen, todo = set(), list(MAY_IMPORT[start])
        while todo:
            layer = todo.pop()
            assert layer != start, f"MAY_IMPORT lets {start!r} reach itself: the layers must run one way"
            assert layer in MAY_IMPORT, f"MAY_IMPORT[{start!r}] names {layer!r}, which is no layer"
            if layer not in seen:
                seen.add(layer)
                todo += MAY_IMPORT[layer]


@pytest.mark.parametrize("source", sorted(MODULES))
def test_imports_between_layers_are_listed(source):
    allowed = MAY_IMPORT.get(area(source), frozenset()) | {area(source)}
    for edge in EDGES[source]:
        if edge.target.startswith(PACKAGE) and area(edge.target) not in allowed:
            raise AssertionError(f"{show([edge])}: {area(source)!r} may import only {sorted(allowed)}")


def test_no_import_circle_between_folders():
    for members in circles(EDGES):
        assert len({folder(m) for m in members}) == 1, f"import circle across folders: {show_circle(members)}"


def test_no_new_import_circle_within_a_folder():
    for members in circles(EDGES):
        assert frozenset(members) in KNOWN_CIRCLES, f"import circle: {show_circle(members)}"


def test_the_circle_finder_finds_circles_and_only_circles():
    """The two checks above can fail: a circle through two folders (one import of it lazy) is found, a chain
    leading into it is not part of it."""
    x, y, z = "sglang_feather.a.x", "sglang_feather.b.y", "sglang_feather.c.z"
    graph = {
        x: [Edge(x, y, 1, lazy=True)],
        y: [Edge(y, x, 1, lazy=False), Edge(y, "numpy", 2, lazy=False)],
        z: [Edge(z, x, 1, lazy=False)],
    }
    assert circles(graph) == [{x, y}]
    assert circles({x: graph[x], y: [], z: graph[z]}) == []


@pytest.mark.parametrize("source", sorted(n for n in MODULES if area(n) in CORE))
def test_core_imports_no_engine(source):
    for edge in EDGES[source]:
        assert edge.target.split(".")[0] not in ENGINES, show([edge])


@pytest.mark.parametrize("source", sorted(n for n in MODULES if area(n) in RUNTIME))
def test_runtime_modules_reach_no_tooling_even_lazily(source):
    for target, chain in reach(source, follow_lazy=True).items():
        assert area(target) in RUNTIME | {""}, show(chain)


@pytest.mark.parametrize(
    "start", sorted({f"{PACKAGE}.{a}" for a in ENGINE_FREE} | set(plugin_entry_points()))
)
def test_importing_reaches_an_engine_only_inside_a_function(start):
    for target, chain in reach(start, follow_lazy=False).items():
        assert target.split(".")[0] not in ENGINES, show(chain)


def is_submodule(package: str, name: str) -> bool:
    """A Python submodule, or a compiled extension (`_tree`) built from the C++ sources in the package."""
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
