"""Port reservations across processes, and a server started again when its port was taken (real sockets and
child processes; no SGLang server needed)."""

import random
import socket
import subprocess
import sys
import time

import pytest
from test_serving_process import fake_python

from sglang_feather.serving import Server, ServerSpec, ServerStartError
from sglang_feather.serving import server as server_module
from sglang_feather.serving.ports import LOW, PortReservation, ephemeral_low, reserve_port
from sglang_feather.serving.server import MAX_LAUNCHES, PortTaken

HOLD_A_PORT = (
    "from sglang_feather.serving.ports import reserve_port\n"
    "r = reserve_port()\n"
    "print(r.port, flush=True)\n"
    "import time; time.sleep(60)\n"
)
HTTP_SERVER = """
import http.server, socket
port = int(sys.argv[sys.argv.index('--port') + 1])
try:
    httpd = http.server.HTTPServer(('127.0.0.1', port), type('H', (http.server.BaseHTTPRequestHandler,), {
        'do_GET': lambda self: (self.send_response(200), self.end_headers()),
        'log_message': lambda self, *a: None,
    }))
except OSError as error:
    # What SGLang's uvicorn logs; like SGLang, the process then stays up (its scheduler child holds it).
    print(f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): "
          "address already in use", flush=True)
    time.sleep(300)
print('serving on', port, flush=True)
httpd.serve_forever()
"""


class FirstThese(random.Random):
    """Draws `ports` first, in order, then whatever a seeded draw gives."""

    def __init__(self, ports):
        super().__init__(0)
        self.ports = list(ports)

    def sample(self, population, k):
        rest = [p for p in super().sample(population, k) if p not in self.ports]
        return (self.ports + rest)[:k]


@pytest.fixture
def taken():
    """A reservable port another socket has bound (not taken, so a health check is refused at once)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reservation = reserve_port()
    sock.bind(("127.0.0.1", reservation.port))
    reservation.release()
    yield sock.getsockname()[1]
    sock.close()


def test_reserved_ports_lie_below_the_ephemeral_range_and_bind():
    reservations = [reserve_port() for _ in range(20)]
    try:
        ports = [r.port for r in reservations]
        assert len(set(ports)) == len(ports)
        assert all(LOW <= port < ephemeral_low() for port in ports)
        for port in ports:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port))
    finally:
        for r in reservations:
            r.release()


def test_a_port_another_process_holds_is_never_handed_out_until_it_exits():
    holder = subprocess.Popen([sys.executable, "-c", HOLD_A_PORT], stdout=subprocess.PIPE, text=True)
    try:
        held = int(holder.stdout.readline())
        mine = reserve_port(FirstThese([held]))
        assert mine.port != held
        mine.release()
    finally:
        holder.kill()
        holder.wait()
    again = reserve_port(FirstThese([held]))
    assert again.port == held
    again.release()


def test_a_bound_port_is_skipped_and_a_released_one_comes_back(taken):
    skipped = reserve_port(FirstThese([taken]))
    assert skipped.port != taken
    same = reserve_port(FirstThese([skipped.port]))
    assert same.port != skipped.port, "a reservation this process holds was handed out twice"
    skipped.release()
    back = reserve_port(FirstThese([skipped.port]))
    assert back.port == skipped.port
    back.release()
    same.release()


def test_a_taken_port_starts_the_server_again_on_a_fresh_one(tmp_path, monkeypatch, taken):
    handed = iter([PortReservation(taken, None)])
    monkeypatch.setattr(server_module, "reserve_port", lambda: next(handed, None) or reserve_port())
    log = tmp_path / "s.log"
    server = Server(
        ServerSpec("m", "fcfs"), log_path=log, python=fake_python(tmp_path, HTTP_SERVER), startup_timeout_s=20
    )
    began = time.monotonic()
    with server:
        assert server.port != taken
        assert time.monotonic() - began < 60
        text = log.read_text()
        assert f"port {taken} was taken; starting again on {server.port}" in text
        assert text.count("fake server pid") == 2


def test_a_port_the_spec_names_is_reported_taken_at_once(tmp_path, taken):
    spec = ServerSpec("m", "fcfs", port=taken)
    server = Server(
        spec, log_path=tmp_path / "s.log", python=fake_python(tmp_path, HTTP_SERVER), startup_timeout_s=20
    )
    began = time.monotonic()
    with pytest.raises(PortTaken, match=f"port {taken} was taken") as info:
        server.start()
    assert time.monotonic() - began < 60
    assert isinstance(info.value, ServerStartError) and not server.is_running()


def test_a_port_taken_every_time_gives_up_after_the_last_launch(tmp_path, monkeypatch, taken):
    monkeypatch.setattr(server_module, "reserve_port", lambda: PortReservation(taken, None))
    log = tmp_path / "s.log"
    server = Server(
        ServerSpec("m", "fcfs"), log_path=log, python=fake_python(tmp_path, HTTP_SERVER), startup_timeout_s=20
    )
    with pytest.raises(PortTaken):
        server.start()
    assert log.read_text().count("fake server pid") == MAX_LAUNCHES
    assert not server.is_running()
