"""Bad scheduling flags fail at startup, before any model is loaded, with a message naming the problem."""

from dataclasses import dataclass

import pytest
from conftest import STARTUP_TIMEOUT_S

from sglang_feather.serving import Server, ServerSpec, ServerStartError

CASES = {
    "chunk-size-zero": (
        ("feather", ("--feather-chunk-size", "0")),
        ("FeatherOptionsError", "--feather-chunk-size", "positive"),
    ),
    "feather-flag-without-feather": (
        ("fcfs", ("--feather-chunk-size", "32")),
        ("--schedule-policy feather",),
    ),
}
"""The real launcher, the plugin loaded from its entry point: a Feather check failing, and a Feather flag under
another policy. Every other bad value goes through the same parse and is checked in-process, each with its
message, in tests/sglang/test_options.py (a launch costs about 18 CPU-seconds of imports)."""


@dataclass(frozen=True)
class Outcome:
    error: ServerStartError | None
    log: str


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, tiny_model) -> dict[str, Outcome]:
    """Launch every bad configuration side by side; each must exit on its own."""
    log_dir = tmp_path_factory.mktemp("startup-errors")
    servers = {
        name: Server(
            ServerSpec(model=tiny_model, policy=policy, extra_args=args),
            log_path=log_dir / f"{name}.log",
            startup_timeout_s=STARTUP_TIMEOUT_S,
        )
        for name, ((policy, args), _) in CASES.items()
    }
    for server in servers.values():
        server.launch()
    results = {}
    for name, server in servers.items():
        error = None
        try:
            server.wait_ready()
        except ServerStartError as err:
            error = err
        finally:
            server.stop()
        results[name] = Outcome(error, server.log_path.read_text(errors="replace"))
    return results


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_flags_fail_at_startup_with_a_clear_message(outcomes, case):
    outcome = outcomes[case]
    assert outcome.error is not None, f"{CASES[case][0]} started a server instead of failing"
    assert outcome.error.exit_code not in (None, 0), (
        f"expected a non-zero exit, got {outcome.error.exit_code}"
    )
    for fragment in CASES[case][1]:
        assert fragment in outcome.error.log_tail, f"{fragment!r} not in the server's error output"
    assert "Load weight begin" not in outcome.log, "the model was loaded before the bad flag was rejected"
