"""A server told to listen where it cannot, in real subprocesses.

Properties checked:
- namesrv, broker and controller (its gRPC and its Raft port) on a port another process
  listens on exit 2 with one sentence saying the port is in use: no traceback, no gRPC
  C-core log line, no retrying forever;
- an address that is not this machine's is one sentence too;
- port 0 is refused with a sentence that asks for a port (not "malformed"): every one
  of these addresses is dialled by others, so it must be known before the server starts.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

pytestmark = [pytest.mark.timeout(60)]
LOG_FLAGS = ["--log-level", "ERROR"]  # the controller's advice about its Raft secret is a warning
NOWHERE = "127.0.0.1:1"


@pytest.fixture(scope="module")
def taken() -> Iterator[str]:
    """An address another process (this one) listens on."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        yield f"127.0.0.1:{listening.getsockname()[1]}"


def servers(address: str, tmp_path) -> dict[str, list[str]]:
    """Each server command with `address` where it listens."""
    data = str(tmp_path)
    return {
        "namesrv": ["namesrv", "--listen", address, "--controllers", NOWHERE],
        "broker": ["broker", "--broker-name", "b", "--listen", address, "--controllers", NOWHERE,
                   "--data-dir", f"{data}/b"],
        "controller --grpc": ["controller", "--id", "c1", "--grpc", address, "--raft", "127.0.0.1:2",
                              "--data-dir", f"{data}/c1"],
        "controller --raft": ["controller", "--id", "c2", "--grpc", "127.0.0.1:2", "--raft", address,
                              "--data-dir", f"{data}/c2"],
    }  # fmt: skip


def run_each(commands: dict[str, list[str]]) -> dict[str, tuple[int, str]]:
    """Each command's exit status and stderr, from one interpreter (fast: one start-up).
    Whatever reaches the process's own stderr, outside the command's (a gRPC C-core log
    line, a traceback), fails the test."""
    code = (
        "import contextlib, io, json, sys\n"
        "from mqmeta.cli import main\n"
        "answers = {}\n"
        f"for name, argv in {commands!r}.items():\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        f"        status = main([*{LOG_FLAGS!r}, *argv])\n"
        "    answers[name] = [status, err.getvalue()]\n"
        "print(json.dumps(answers))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return {name: (status, text) for name, (status, text) in json.loads(result.stdout).items()}


def assert_one_sentence(answers: dict[str, tuple[int, str]], fragment: str) -> None:
    for name, (status, text) in answers.items():
        lines = [line for line in text.splitlines() if line.strip()]
        assert status == 2, (name, text)
        assert len(lines) == 1 and lines[0].startswith("mqmeta: error:"), (name, text)
        assert fragment in lines[0], (name, text)


def test_a_port_in_use_is_one_sentence(taken, tmp_path):
    assert_one_sentence(run_each(servers(taken, tmp_path)), f"cannot listen on {taken}: the port is in use")


def test_an_address_not_of_this_machine_is_one_sentence(tmp_path):
    elsewhere = "192.0.2.1:7000"  # TEST-NET-1: never a local address
    commands = {k: v for k, v in servers(elsewhere, tmp_path).items() if k in ("namesrv", "broker")}
    assert_one_sentence(run_each(commands), "is not one of this machine's")


def test_port_0_asks_for_a_port(tmp_path):
    answers = run_each(servers("127.0.0.1:0", tmp_path))
    assert_one_sentence(answers, "port 0 is not allowed here: give a port from 1 to 65535")
