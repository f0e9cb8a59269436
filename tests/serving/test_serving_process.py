"""Process groups and server launch failures, with real child processes (no SGLang server needed)."""

import os
import sys
import time

import pytest

from sglang_feather.serving import Server, ServerSpec, ServerStartError
from sglang_feather.serving.process import ProcessGroup, run_cli

FAKE_SERVER = (
    "import os, sys, time\n"
    "if sys.argv[1:3] != ['-m', 'sglang.launch_server']: sys.exit(9)\n"
    "print('fake server pid', os.getpid(), flush=True)\n"
    "{body}\n"
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


def fake_python(tmp_path, body: str) -> str:
    """An executable that stands in for the interpreter: `<it> -m sglang.launch_server ...` runs `body`."""
    script = tmp_path / "fake_python"
    script.write_text(f"#!{sys.executable}\n" + FAKE_SERVER.format(body=body))
    script.chmod(0o755)
    return str(script)


def test_stop_kills_the_whole_group_including_grandchildren(tmp_path):
    pid_file = tmp_path / "child.pid"
    group = ProcessGroup(
        ["sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait"], env=os.environ, log_path=tmp_path / "g.log"
    )
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "child never started"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert alive(child)
    group.stop(grace_s=5)
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)
    assert group.poll() is not None


def test_a_server_that_exits_at_startup_raises_with_its_exit_code_and_log(tmp_path):
    python = fake_python(tmp_path, "print('error: bad flag --x', flush=True); sys.exit(3)")
    server = Server(ServerSpec("m", "fcfs"), log_path=tmp_path / "s.log", python=python, startup_timeout_s=30)
    with pytest.raises(ServerStartError) as info:
        server.start()
    assert info.value.exit_code == 3
    assert "error: bad flag --x" in info.value.log_tail
    assert "exited with code 3" in str(info.value)
    assert not server.is_running()


def test_a_server_that_never_answers_times_out_and_is_killed(tmp_path):
    python = fake_python(tmp_path, "time.sleep(300)")
    server = Server(
        ServerSpec("m", "fcfs"), log_path=tmp_path / "s.log", python=python, startup_timeout_s=1.5
    )
    with pytest.raises(ServerStartError, match="not healthy after") as info:
        server.start()
    assert info.value.exit_code is None
    pid = int(info.value.log_tail.split("fake server pid")[1].split()[0])
    assert not alive(pid)


def test_unknown_engine_or_device_is_rejected_before_launch(tmp_path):
    with pytest.raises(ValueError, match="unknown engine"):
        Server(ServerSpec("m", "fcfs", engine="nope"), log_path=tmp_path / "s.log")
    with pytest.raises(ValueError, match="unknown device"):
        Server(ServerSpec("m", "fcfs", device="tpu"), log_path=tmp_path / "s.log")


def test_run_cli_exits_with_mains_status_and_130_on_ctrl_c(capsys):
    def interrupted() -> int:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as done:
        run_cli(lambda: 3)
    assert done.value.code == 3
    with pytest.raises(SystemExit) as stopped:
        run_cli(interrupted)
    assert stopped.value.code == 130 and "every server was stopped" in capsys.readouterr().err
