"""Run settings shared by the correctness stage and the sweep, and what the run records about its device."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import subprocess
from dataclasses import dataclass, field

import torch

from kernels_bench.timing import TimingConfig
from kernels_bench.workload import LLAMA3_8B, HeadShape

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}
"""Allowed max |out - ref| relative to max |ref|, per input dtype (the kernels accumulate in float32)."""


@dataclass(frozen=True)
class RunConfig:
    device: str
    kernels: tuple[str, ...]
    dtype: torch.dtype = torch.bfloat16
    timing: TimingConfig = field(default_factory=TimingConfig)
    num_sets: int = 2
    sdpa_max_bytes: int = 4 << 30
    memory_fraction: float = 0.6
    seed: int = 0
    shape: HeadShape = LLAMA3_8B


def _driver_version() -> str | None:
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip().splitlines()[0] if result.stdout.strip() else None


def device_info(device: str) -> dict:
    info: dict = {"device": device, "torch": torch.__version__, "date": dt.datetime.now(dt.UTC).isoformat()}
    try:
        info["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        info["triton"] = None
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name,
            num_sms=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", None),
            memory_bytes=props.total_memory,
            cuda=torch.version.cuda,
            driver=_driver_version(),
        )
    else:
        info.update(gpu=None, num_sms=8, l2_bytes=None, memory_bytes=None, cuda=None, driver=None)
    return info


def generator(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)
