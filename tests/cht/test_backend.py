"""Backend selection: SGLANG_FEATHER_CHT, read once at import; the Python tree when the extension is absent."""

import os
import subprocess
import sys

import pytest

HIDE_EXTENSION = "import sys; sys.modules['sglang_feather.cht._native._tree'] = None\n"
REPORT = "import sglang_feather.cht as c; print(c.backend_name(), c.ChunkedHashTree.__name__)"


def run(code, env_value=None):
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_FEATHER_CHT"}
    if env_value is not None:
        env["SGLANG_FEATHER_CHT"] = env_value
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_auto_picks_the_compiled_tree_when_built(native_cls):
    assert run(REPORT).stdout.split() == ["native", "NativeTree"]


@pytest.mark.parametrize("value", ["python", " Python "])
def test_python_forced(value):
    assert run(REPORT, value).stdout.split() == ["python", "PythonTree"]


def test_native_forced(native_cls):
    assert run(REPORT, "native").stdout.split() == ["native", "NativeTree"]


def test_absent_extension_falls_back_to_python():
    done = run(HIDE_EXTENSION + REPORT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["python", "PythonTree"]


def test_absent_extension_with_native_forced_fails_loudly():
    done = run(HIDE_EXTENSION + REPORT, "native")
    assert (
        done.returncode != 0
        and "SGLANG_FEATHER_CHT=native but the compiled Chunked Hash Tree is not built" in done.stderr
    )


def test_unknown_value_refused():
    done = run(REPORT, "rust")
    assert done.returncode != 0 and "expected python, native or auto" in done.stderr


def test_fallback_tree_runs_a_workload():
    code = (
        HIDE_EXTENSION
        + "from sglang_feather.cht import ChunkedHashTree\n"
        + "t = ChunkedHashTree(4); t.insert('a', list(range(20))); t.insert('b', list(range(18)) + [7])\n"
        + "t.activate('a'); print(t.best().request_id, t.best().num_missing); t.check_invariants()\n"
    )
    done = run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["b", "1"]


def test_the_python_tree_is_a_warning_at_startup():
    done = run("import logging; logging.basicConfig()\n" + HIDE_EXTENSION + REPORT)
    assert done.returncode == 0, done.stderr
    assert "WARNING:sglang_feather.cht.backend:Chunked Hash Tree backend: python" in done.stderr
    assert "26x slower" in done.stderr


def test_the_python_tree_warns_even_with_logging_unconfigured():
    done = run(REPORT, "python")
    assert "Chunked Hash Tree backend: python (forced by SGLANG_FEATHER_CHT=python)" in done.stderr


METRIC = (
    "from prometheus_client import CollectorRegistry\n"
    "from sglang_feather.sglang.metrics import FeatherMetrics\n"
    "registry = CollectorRegistry()\n"
    "FeatherMetrics({'model_name': 'tiny'}, registry=registry)\n"
    "for backend in ('native', 'python'):\n"
    "    labels = {'model_name': 'tiny', 'cht_backend': backend}\n"
    "    print(backend, registry.get_sample_value('sglang:feather_info', labels))\n"
)


def test_the_info_metric_names_the_python_tree():
    done = run(HIDE_EXTENSION + METRIC)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["native", "None", "python", "1.0"]


def test_the_info_metric_names_the_compiled_tree(native_cls):
    done = run(METRIC)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["native", "1.0", "python", "None"]
