"""Every CHT test runs against either tree; the compiled one must be built unless SGLANG_FEATHER_CHT=python."""

import os

import pytest

from sglang_feather.cht import PythonTree


def native_tree():
    try:
        from sglang_feather.cht.native import NativeTree
    except ImportError as err:
        if os.environ.get("SGLANG_FEATHER_CHT", "").strip().lower() == "python":
            pytest.skip("SGLANG_FEATHER_CHT=python: the compiled tree is deliberately not tested")
        pytest.fail(
            f"the compiled Chunked Hash Tree is not built ({err}): run `make setup` or `pip install -e .`, or set "
            "SGLANG_FEATHER_CHT=python to test the Python tree alone"
        )
    return NativeTree


BACKENDS = {"python": lambda: PythonTree, "native": native_tree}


@pytest.fixture(params=list(BACKENDS))
def tree_cls(request):
    return BACKENDS[request.param]()


@pytest.fixture
def native_cls():
    return native_tree()
