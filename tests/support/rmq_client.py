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
