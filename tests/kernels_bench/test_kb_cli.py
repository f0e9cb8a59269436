"""The benchmark CLI end to end on CPU: --help, the --tiny smoke sweep, unavailable kernels, bad input."""

from __future__ import annotations

import json

import pytest
import torch

from kernels_bench import decode_locality


@pytest.fixture
def one_thread():
    """Tiny tensors: intra-op threads only add contention on a shared CI machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_help_documents_the_presets_and_the_device(capsys):
    with pytest.raises(SystemExit) as exit_info:
        decode_locality.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--reduced", "--tiny", "--device", "--kernels", "--orders", "--page-sizes", "--out"):
        assert option in text


def test_tiny_cpu_sweep_checks_times_and_writes_ratios(tmp_path, capsys, one_thread):
    out = tmp_path / "tiny.json"
    argv = ["--device", "cpu", "--tiny", "--batch-sizes", "4", "--warmup", "0", "--repeats", "2"]
    argv += ["--kernels", "sdpa,splitk_torch,triton,flashinfer", "--out", str(out)]
    assert decode_locality.main(argv) == 0
    printed = capsys.readouterr().out
    assert "kernel triton: not available: the Triton kernel needs a CUDA device" in printed
    assert "kernel flashinfer: not available" in printed
    document = json.loads(out.read_text())
    assert document["meta"]["kernels"]["sdpa"] == "ok"
    assert all(check["ok"] for check in document["correctness"])
    assert {c["kernel"] for c in document["correctness"]} == {"sdpa", "splitk_torch"}
    rows = document["measurements"]
    points = {(r["num_groups"], r["order"]) for r in rows}
    assert points == {(1, "contiguous"), (2, "contiguous"), (2, "interleaved"), (4, "contiguous")}
    for row in rows:
        assert row["status"] == "ok" and row["median_ms"] > 0 and row["rel_err"] < 2e-2
        assert row["total_gbps"] >= row["unique_gbps"]
        assert row["total_kv_bytes"] >= row["unique_kv_bytes"]
    kinds = {(r["kernel"], r["kind"]) for r in document["ratios"]}
    assert ("sdpa", "heterogeneous/homogeneous") in kinds and (
        "splitk_torch",
        "interleaved/contiguous",
    ) in kinds


def test_unknown_kernel_and_missing_cuda_are_clear_errors(tmp_path, capsys):
    assert (
        decode_locality.main(["--device", "cpu", "--kernels", "magic", "--out", str(tmp_path / "x.json")])
        == 2
    )
    assert "unknown kernels ['magic']" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
