"""bench/peers starts each peer that is installed as a 3-node cluster on loopback and
stops every process it started (by pid): after stop() none of its pids is alive. A peer
that is not installed is skipped here as the bench skips it (with the package to install).
RabbitMQ's start takes ~40 s on this machine kind: slow runs only. Not the benchmark."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.peers.load import _strace_calls
from bench.peers.servers import PEERS, _alive, absent

pytestmark = [pytest.mark.timeout(180)]

PARAMS = [
    pytest.param("etcd"),
    pytest.param("nats"),
    pytest.param("rabbitmq", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name", PARAMS)
def test_peer_starts_three_nodes_and_stops_them(name: str, tmp_path: Path) -> None:
    why = absent(name)
    if why is not None:
        pytest.skip(why)
    peer = PEERS[name](tmp_path)
    try:
        peer.start()
        pids = peer.pids()
        assert len(pids) == 3, pids
        assert all(_alive(pid) for pid in pids.values())
    finally:
        peer.stop()
    assert not any(_alive(pid) for pid in pids.values()), pids
    assert peer.pids() == {}


def test_strace_summary_is_read_per_call() -> None:
    summary = (
        "% time     seconds  usecs/call     calls    errors syscall\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        " 90.00    0.000900           3       300           fdatasync\n"
        " 10.00    0.000100           6        16         2 fsync\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        "100.00    0.001000           3       316         2 total\n"
    )
    assert _strace_calls(summary) == {"fdatasync": 300, "fsync": 16}
