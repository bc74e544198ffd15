"""Checks that run in a process of their own (a pytest process may hold the official
RocketMQ client's apache.rocketmq.v2 stubs, which clash with ours: tests/support/rmq_client.py).

A checks module ends with `if __name__ == "__main__": run_named(CHECKS, sys.argv[1:])`;
its test module calls `results_of(module, names, timeout_s)` once (a module fixture) and
asserts each name's result is "ok". `run_script` runs a short script in a fresh interpreter
(what a test must see before anything in this process imported it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def run_named(checks: Mapping[str, Callable[[], None]], names: Iterable[str]) -> None:
    """Runs the named checks and prints one JSON object: name -> "ok" or the traceback."""
    results: dict[str, str] = {}
    for name in names:
        try:
            checks[name]()
            results[name] = "ok"
        except Exception:  # reported to the test, which fails naming it
            results[name] = traceback.format_exc()[-4000:]
    print(json.dumps(results))


def results_of(module: str, names: Iterable[str], timeout_s: float) -> dict[str, str]:
    """`python -m module NAME...` from the repository root: each name's result."""
    done = subprocess.run(
        [sys.executable, "-m", module, *names], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


def run_script(script: str, timeout_s: float = 30) -> subprocess.CompletedProcess:
    """`python -c SCRIPT` in a fresh interpreter that imports this checkout's packages."""
    return subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
