"""Launch SMG (`smg launch`, the SGLang ecosystem's router) in front of running workers, and read its counters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sglang_feather.serving.metrics import MetricsSnapshot, scrape
from sglang_feather.serving.ports import reserve_port
from sglang_feather.serving.process import ProcessGroup
from sglang_feather.serving.server import ServerStartError

SMG_VERSION = "1.13.0"
"""The router release this harness was written against (requirements/sglang-cpu.txt pins it)."""
BRANCH_SERIES = "smg_cache_aware_policy_branch_total"
"""SMG's counter of cache_aware decisions by `branch`: `tree_match` (sent to a worker holding the matched
prefix), `spill` (the match cleared `--cache-threshold` but the request went elsewhere: the spill gate or
worker overload protection), `expected_wait_fallback` (a cache miss, routed by load)."""


NO_KEEPALIVE = ("--sse-keepalive-secs", "0")
"""SMG sends an SSE comment after 15 s without a token (`--sse-keepalive-secs`, for idle-timeout proxies);
bench_serving's sglang client parses every stream line as JSON and counts that request as failed. On a loaded
CPU a request can wait that long for its first token (16 of 128 failed so in one dfs-weight run)."""


@dataclass(frozen=True)
class RouterSpec:
    policy: str = "cache_aware"
    extra_args: tuple[str, ...] = ()
    port: int | None = None


def router_argv(
    spec: RouterSpec, worker_urls: Sequence[str], port: int, metrics_port: int, python: str
) -> list[str]:
    """`python -m smg.launch_router` is the module behind the `smg launch` console script."""
    return [
        python, "-m", "smg.launch_router", "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *worker_urls, "--policy", spec.policy,
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        *NO_KEEPALIVE, *spec.extra_args,
    ]  # fmt: skip


class Router:
    """One SMG process group in front of `worker_urls`; ready once every worker is registered and healthy."""

    def __init__(
        self,
        spec: RouterSpec,
        worker_urls: Sequence[str],
        *,
        log_path: Path,
        python: str = sys.executable,
        startup_timeout_s: float = 120.0,
    ) -> None:
        self.spec = spec
        self.worker_urls = tuple(worker_urls)
        self._reservations = [reserve_port(), reserve_port()]
        self.port = spec.port or self._reservations[0].port
        self.metrics_port = self._reservations[1].port
        self.log_path = log_path
        self.python = python
        self.startup_timeout_s = startup_timeout_s
        self._group: ProcessGroup | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> float:
        began = time.monotonic()
        argv = router_argv(self.spec, self.worker_urls, self.port, self.metrics_port, self.python)
        self._group = ProcessGroup(argv, env=dict(os.environ), log_path=self.log_path)
        try:
            while not self._all_workers_ready():
                if self._group.poll() is not None:
                    raise ServerStartError(
                        "smg exited during startup", self._group.poll(), self._group.log_tail()
                    )
                if time.monotonic() - began > self.startup_timeout_s:
                    raise ServerStartError("smg workers not ready", None, self._group.log_tail())
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - began

    def _all_workers_ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + "/workers", timeout=5) as response:
                workers = json.loads(response.read())["workers"]
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError, KeyError):
            return False
        healthy = {w["url"] for w in workers if w.get("is_healthy")}
        return healthy >= set(self.worker_urls)

    def branches(self) -> dict[str, float]:
        """SMG's cache_aware decisions so far, by branch."""
        snapshot: MetricsSnapshot = scrape(f"http://127.0.0.1:{self.metrics_port}")
        return {
            dict(labels).get("branch", ""): value
            for (name, labels), value in snapshot.samples.items()
            if name == BRANCH_SERIES
        }

    def is_running(self) -> bool:
        return self._group is not None and self._group.poll() is None

    def stop(self) -> None:
        if self._group is not None:
            group, self._group = self._group, None
            try:
                group.stop(grace_s=10.0)
            except subprocess.SubprocessError:
                pass
        for reservation in self._reservations:
            reservation.release()

    def __enter__(self) -> Router:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
