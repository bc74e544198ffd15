"""The two RocketMQ 4.x Python clients the remoting tests drive, each installed by the
test session into a directory of its own (both import as `rocketmq`, as does the official
RocketMQ 5 client in the test venv) and run in a subprocess with PYTHONPATH on it.

- rocketmq-client-python 2.0.0 loads the C++ client's librocketmq.so, which no registry
  ships: a build of it lives in ../shared/clients/librocketmq/ beside the checkout;
- rocketmq 0.4.4 bundles its own copy of that library in its wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# name -> the pinned requirement pip installs into CACHE/name
CLIENTS = {
    "rocketmq-client-python": "rocketmq-client-python==2.0.0",
    "rocketmq": "rocketmq==0.4.4",
}
CACHE = Path(os.environ.get("MQMETA_TEST_CLIENTS", Path.home() / ".cache" / "mqmeta-test-clients"))
DRIVER = Path(__file__).with_name("remoting_driver.py")
ROOT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT_S = 300.0
LIBRARY = Path("clients") / "librocketmq" / "librocketmq.so"


def shared_library() -> Path | None:
    """librocketmq.so in a `shared` folder beside the checkout (or beside one of its parents:
    a git worktree sits deeper)."""
    for parent in ROOT.parents:
        candidate = parent / "shared" / LIBRARY
        if candidate.exists():
            return candidate
    return None


def install(name: str) -> Path:
    """CACHE/name with the client installed (pip install --target, once)."""
    target = CACHE / name
    marker = target / ".installed"
    if marker.exists() and marker.read_text() == CLIENTS[name]:
        return target
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), CLIENTS[name]],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    if done.returncode != 0:
        pytest.fail(f"pip could not install {CLIENTS[name]}: {done.stderr[-2000:]}")
    marker.write_text(CLIENTS[name])
    return target


class Client:
    """One installed client, driven through remoting_driver.py."""

    def __init__(self, name: str, directory: Path, home: Path, library_dir: Path | None = None) -> None:
        self.name = name
        self.directory = directory
        self.home = home  # the C++ client writes its logs under $HOME/logs
        self.library_dir = library_dir

    def run(self, *args: str, timeout_s: float = 90.0) -> list[dict]:
        env = self.environment()
        done = subprocess.run(
            [sys.executable, str(DRIVER), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            cwd=self.home,
        )
        assert done.returncode == 0, f"{self.name} {args[0]} failed: {done.stderr[-3000:]}"
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    def environment(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(self.directory), "HOME": str(self.home)}
        if self.library_dir is not None:
            env["LD_LIBRARY_PATH"] = str(self.library_dir)
        return env

    def stream(self, output: Path, *args: str) -> subprocess.Popen:
        """A stream command of the driver in the background, its lines into `output` (its
        errors beside it, in OUTPUT.err)."""
        with open(output, "wb") as sink, open(output.with_suffix(".err"), "wb") as errors:
            return subprocess.Popen(
                [sys.executable, str(DRIVER), *args],
                stdout=sink,
                stderr=errors,
                env=self.environment(),
                cwd=self.home,
            )

    def produce(self, namesrv: str, topic: str, count: int, tag: str = "", keys: str = "", prefix: str = "m"):
        return self.run("produce", namesrv, topic, f"pg-{prefix}", str(count), tag, keys, prefix)

    def consume(
        self,
        namesrv: str,
        topic: str,
        group: str,
        expected: int,
        expression: str = "*",
        timeout_s: float = 45.0,
    ) -> list[dict]:
        return self.run(
            "consume",
            namesrv,
            topic,
            group,
            expression,
            str(expected),
            str(timeout_s),
            timeout_s=timeout_s + 30,
        )


def client(name: str, home: Path) -> Client:
    """The installed client `name`; skips with the reason when its library is missing."""
    library_dir = None
    if name == "rocketmq-client-python":
        library = shared_library()
        if library is None:
            pytest.skip(f"rocketmq-client-python needs {LIBRARY} in a 'shared' folder beside the checkout")
        library_dir = library.parent
    home.mkdir(parents=True, exist_ok=True)
    return Client(name, install(name), home, library_dir)
