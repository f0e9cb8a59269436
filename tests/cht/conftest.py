"""Every CHT test runs against both cores; the compiled one must be built unless SGLANG_FEATHER_CHT=python."""

import os

import pytest

from sglang_feather.cht import PythonTree


def native_tree():
    try:
        from sglang_feather.cht.native import NativeTree
    except ImportError as err:
        if os.environ.get("SGLANG_FEATHER_CHT", "").strip().lower() == "python":
            pytest.skip("SGLANG_FEATHER_CHT=python: the compiled core is deliberately not tested")
        pytest.fail(
            f"the compiled CHT core is not built ({err}): run `make setup` or `pip install -e .`, or set "
            "SGLANG_FEATHER_CHT=python to test the Python core alone"
        )
    return NativeTree


CORES = {"python": lambda: PythonTree, "native": native_tree}


@pytest.fixture(params=list(CORES))
def tree_cls(request):
    return CORES[request.param]()
