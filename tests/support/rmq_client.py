"""The official RocketMQ 5 Python client (rocketmq-python-client, unchanged) for the tests,
the chaos workload and the benchmark.

It writes its log under $HOME/logs, decided when `rocketmq` is first imported, so the
first import happens here with HOME pointed at a temporary directory. This process must
not import mqmeta's own apache.rocketmq.v2 stubs (the two register the same proto names);
the servers run in their own processes.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

_LOG_HOME = tempfile.mkdtemp(prefix="rmq-client-home-")


def client() -> Any:
    """The `rocketmq` package, imported with its logs under a temporary HOME."""
    home = os.environ.get("HOME")
    os.environ["HOME"] = _LOG_HOME
    try:
        import rocketmq
    finally:
        if home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = home
    return rocketmq


def main_thread_on_client_loop() -> None:
    """Makes the client's I/O loop this (main) thread's current event loop.

    The 5.1.2 client rebuilds a broken Telemetry stream (its nameserver or broker died) on
    whichever thread saw a settings write fail, and grpc.aio takes that thread's current
    event loop. The main thread has none once anything in the process ran `asyncio.run()`
    (other test modules in the same xdist worker do), and the rebuild then fails with "There
    is no current event loop in thread 'MainThread'". The client means its streams to live on
    its I/O loop (it makes that loop current wherever it creates a channel); call this after
    a client started, so that the main thread's rebuilds do too."""
    import asyncio

    from rocketmq.v5.client.connection.rpc_client import RpcClient

    assert RpcClient._io_loop is not None, "no official client has started in this process"
    asyncio.set_event_loop(RpcClient._io_loop)
