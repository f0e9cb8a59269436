"""The Chunked Hash Tree backend: the compiled tree when it is built, else the Python tree."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, TypeAlias

from sglang_feather.cht.hashing import DEFAULT_CHUNK_SIZE
from sglang_feather.cht.tree import PythonTree

if TYPE_CHECKING:
    from sglang_feather.cht.native import NativeTree

    ChunkedHashTree: TypeAlias = PythonTree | NativeTree
    """Either tree: the type checker holds every caller to what both implementations provide."""

ENV_VAR = "SGLANG_FEATHER_CHT"
"""`python` or `native` forces a backend (`native` fails loudly when it is not built); unset or `auto` picks."""

logger = logging.getLogger(__name__)


def _select() -> tuple[type[PythonTree] | type[NativeTree], str, str]:
    """The tree class, its backend's name and why it was chosen."""
    choice = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if choice not in ("auto", "python", "native"):
        raise ValueError(f"{ENV_VAR}={choice!r}: expected python, native or auto")
    if choice == "python":
        return PythonTree, "python", f"forced by {ENV_VAR}=python"
    try:
        from sglang_feather.cht.native import NativeTree
    except ImportError as err:
        if choice == "native":
            raise ImportError(
                f"{ENV_VAR}=native but the compiled Chunked Hash Tree is not built ({err}); run `make setup` or "
                "`pip install -e .` with a C++ compiler"
            ) from err
        return PythonTree, "python", f"the compiled tree is not built ({err})"
    return NativeTree, "native", f"{ENV_VAR}={choice}"


PYTHON_TREE_WARNING = (
    "Chunked Hash Tree backend: python (%s). The Python tree is about 26x slower per scheduling run than the "
    "compiled one; reinstall with a C++17 compiler (`pip install sglang-feather` builds it) to get it back."
)


_TREE_CLASS, BACKEND, _REASON = _select()
if not TYPE_CHECKING:
    ChunkedHashTree = _TREE_CLASS  # the chosen class: `ChunkedHashTree(chunk_size)` builds a tree at run time
if BACKEND == "python":
    logger.warning(PYTHON_TREE_WARNING, _REASON)
else:
    logger.info("Chunked Hash Tree backend: %s (%s)", BACKEND, _REASON)


def new_tree(chunk_size: int = DEFAULT_CHUNK_SIZE) -> ChunkedHashTree:
    """An empty tree of the backend `backend_name()` names (a type alias cannot be called where it is checked)."""
    return _TREE_CLASS(chunk_size)


def backend_name() -> str:
    """`native` or `python`: the backend `ChunkedHashTree` is (the startup log line, and the `cht_backend` label of the
    `sglang:feather_info` metric, sglang/metrics.py)."""
    return BACKEND
