"""Fixtures for end-to-end tests against real SGLang servers on the tiny model (one server per module)."""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import sglang  # noqa: F401  (a missing SGLang must fail these tests, never skip them)

from sglang_feather.serving import Server, ServerSpec

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = REPO / "models" / "tiny-llama"
STARTUP_TIMEOUT_S = 480.0
"""How long a test server may take to answer /health_generate. Quiet, a tiny-model server is healthy in about
40 s; under `make test`'s side-by-side lanes on 2 cores (8 pytest workers and up to 4 servers) one `--dp-size 2`
server's tokenizer process took 207 s to start in CI, and 240 s was not enough. It bounds a hang, not speed."""
_STARTUPS: list[tuple[str, float]] = []


@pytest.fixture(scope="session")
def tiny_model() -> str:
    if not (TINY_MODEL / "config.json").is_file():
        pytest.fail(f"{TINY_MODEL} does not exist: run `make model` (part of `make setup`)")
    return str(TINY_MODEL)


@contextmanager
def serving(
    log_dir: Path, model: str, policies_and_args: Sequence[tuple[str, tuple[str, ...]]]
) -> Iterator[list[Server]]:
    """Launch every server at once, wait for all, and stop them all on the way out."""
    servers = [
        Server(
            ServerSpec(model=model, policy=policy, extra_args=args),
            log_path=log_dir / f"{policy}-{index}.log",
            startup_timeout_s=STARTUP_TIMEOUT_S,
        )
        for index, (policy, args) in enumerate(policies_and_args)
    ]
    try:
        for server in servers:
            server.launch()
        for server in servers:
            _STARTUPS.append((server.spec.policy, server.wait_ready()))
        yield servers
    finally:
        for server in servers:
            server.stop()


def pytest_terminal_summary(terminalreporter) -> None:
    if _STARTUPS:
        terminalreporter.write_line(
            "e2e server startups: " + ", ".join(f"{policy} {seconds:.1f}s" for policy, seconds in _STARTUPS)
        )
