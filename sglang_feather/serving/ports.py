"""Listening ports for servers that bind them later: below the kernel's ephemeral range, reserved across processes.

How it works: a port taken from `bind(0)` lies in the kernel's ephemeral range, which `connect()` hands out
as the source port of every outgoing connection on the machine, so by the time a server binds it (minutes
later on a loaded CPU: SGLang's tokenizer process once took 182 s to start in CI) a health check or client
socket may hold it. A reservation instead draws a random port between `LOW` and the ephemeral range's start,
above SGLang's own draw for its NCCL/TCPStore port (`get_free_port_below_ephemeral`, 22000-29999), checks it
binds, and holds an exclusive `flock` on a file named after it for as long as the server lives, so two
harness processes (pytest workers, side-by-side servers) never pick the same one. The lock goes with the
process that holds it, so a crash leaves nothing to clean up.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

LOW = 30000
"""First port drawn: above SGLang's own 22000-29999 (sglang/srt/utils/network.py)."""
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOCK_DIR = Path(tempfile.gettempdir()) / "sglang-feather-ports"
NUM_ATTEMPTS = 256


class PortReservation:
    """A port no other reservation on this machine holds until `release` (or the process exits)."""

    def __init__(self, port: int, lock_fd: int | None) -> None:
        self.port = port
        self._lock_fd = lock_fd

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __repr__(self) -> str:
        return f"PortReservation({self.port})"


def ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def reserve_port(rng: random.Random | None = None) -> PortReservation:
    """A free port below the ephemeral range, locked for this process; `bind(0)`'s if that range is full."""
    rng = rng or random.SystemRandom()
    high = ephemeral_low() - 1
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    candidates = range(LOW, high + 1)
    for port in rng.sample(candidates, min(NUM_ATTEMPTS, len(candidates))):
        lock_fd = _try_lock(port)
        if lock_fd is None:
            continue
        if _binds(port):
            return PortReservation(port, lock_fd)
        os.close(lock_fd)
    return PortReservation(_kernel_port(), None)


def _try_lock(port: int) -> int | None:
    fd = os.open(LOCK_DIR / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _binds(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
