"""Child processes with their logs in DIR/logs, stopped all together."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

STOP_TIMEOUT_S = 10.0


class Supervisor:
    """Starts child processes with their logs in DIR/logs and stops them all together."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "logs").mkdir(parents=True, exist_ok=True)
        self.children: dict[str, subprocess.Popen] = {}

    def start(
        self, name: str, command: list[str], extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        log_file = open(self.root / "logs" / f"{name}.log", "ab")
        env = dict(
            os.environ, MQMETA_LOG_LEVEL=os.environ.get("MQMETA_LOG_LEVEL", "INFO"), **(extra_env or {})
        )
        proc = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL
        )
        log_file.close()
        self.children[name] = proc
        return proc

    def dead(self) -> list[str]:
        return [name for name, p in self.children.items() if p.poll() is not None]

    def stop_all(self) -> None:
        for proc in self.children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.children.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
