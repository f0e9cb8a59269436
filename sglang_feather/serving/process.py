"""Child processes in their own process group, always torn down as a group (on stop, failure or exit)."""

import atexit
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

_LIVE: set["ProcessGroup"] = set()


class ProcessGroup:
    """A command started as the leader of a new session; `stop` signals every process in its group."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.argv = tuple(argv)
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _LIVE.add(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout_s: float | None = None) -> int:
        return self.proc.wait(timeout=timeout_s)

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM the group, SIGKILL whatever is left after `grace_s`; returns the leader's exit code."""
        _LIVE.discard(self)
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        # Children (scheduler, detokenizer) may outlive the leader; the group id stays valid while they run.
        self._signal_group(signal.SIGKILL)
        try:
            return self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, num_lines: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(lines[-num_lines:])

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_all() -> None:
    for group in list(_LIVE):
        group.stop(grace_s=5.0)


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so `with` blocks and atexit tear servers down (CLI entry points only)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def run_cli(main: Callable[[], int]) -> NoReturn:
    """Exit with `main()`'s status; Ctrl-C exits 130 once every server was stopped (CLI entry points only)."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: every server was stopped", file=sys.stderr)
        sys.exit(130)


atexit.register(stop_all)
