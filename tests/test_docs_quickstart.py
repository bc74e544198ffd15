"""The quick start and the README say what really works.

Properties checked:
- every fenced block of docs/quickstart.md marked `<!-- test -->` runs, in order, in one
  shell, against the cluster that the block marked `<!-- test: background -->` starts
  (`mqmeta local up`, run as the page shows it, in a temporary directory), and exits 0;
  local up prints the export line the page shows;
  Ctrl-C (SIGINT) then stops that cluster within a bound, exit status 0, as the page says.
  The install blocks are not marked: installing is what CI's own setup does;
- README.md has at most 250 lines, its first sh block is exactly the developer path's
  two commands, and every relative link it has names a file of the repository (mkdocs
  checks the links of docs/, not the README's).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mqmeta.cluster.wait import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "docs" / "quickstart.md"
README = ROOT / "README.md"
README_LINES_MAX = 250
README_COMMANDS = [
    "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && "
    ".venv/bin/mqmeta local up --data-dir ./mqmeta-data",
    ".venv/bin/python -m pytest",
]
DATA_DIR = "./mqmeta-data"
READY_TIMEOUT_S = 120.0
BLOCKS_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0
_MARKED_BLOCK = re.compile(r"<!-- test(?:: (?P<kind>[a-z]+))? -->\n```sh\n(?P<body>.*?)\n```", re.DOTALL)
_SH_BLOCK = re.compile(r"```sh\n(?P<body>.*?)\n```", re.DOTALL)
_RELATIVE_LINK = re.compile(r"\]\((?!https?://)(?P<path>[^)#]+)(?:#[^)]*)?\)")


def marked_blocks(text: str) -> list[tuple[str, str]]:
    """(kind, body) of every marked sh block, in page order; kind "" or "background"."""
    return [(m.group("kind") or "", m.group("body")) for m in _MARKED_BLOCK.finditer(text)]


def shell_environment() -> dict[str, str]:
    """The page's commands as a user with the venv activated runs them."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_the_quickstart_commands_run_against_a_real_cluster(tmp_path):
    blocks = marked_blocks(QUICKSTART.read_text())
    background = [body for kind, body in blocks if kind == "background"]
    foreground = [body for kind, body in blocks if kind == ""]
    assert len(background) == 1 and background[0].startswith("mqmeta local up "), background
    assert DATA_DIR in background[0] and len(foreground) >= 3, blocks
    assert all(DATA_DIR in body for body in foreground), "every quick-start command names the data dir"
    data_dir = tmp_path / "data"
    env = shell_environment()
    start = background[0].replace(DATA_DIR, str(data_dir))
    log = tmp_path / "local-up.out"
    with open(log, "wb") as sink:
        cluster = subprocess.Popen(
            ["bash", "-c", f"exec {start}"], cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT
        )
    try:

        def ready() -> bool:
            assert cluster.poll() is None, f"local up exited: {log.read_text()}"
            return (data_dir / "cluster.json").exists()

        wait_for(ready, READY_TIMEOUT_S, "the quick start's cluster to write cluster.json", interval_s=0.1)
        script = "set -euo pipefail\n" + "\n".join(foreground).replace(DATA_DIR, str(data_dir))
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCKS_TIMEOUT_S,
        )
        assert done.returncode == 0, f"a quick-start command failed:\n{done.stdout}\n{done.stderr}"
        assert '"acked": 1000' in done.stdout and '"received": 1000' in done.stdout, done.stdout
        assert "export MQMETA_CONTROLLERS=" in log.read_text(), (
            "local up prints the export line the page shows"
        )
    finally:
        if cluster.poll() is None:
            cluster.send_signal(signal.SIGINT)
        try:
            status = cluster.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            cluster.kill()
            cluster.wait()
            raise
    assert status == 0, f"Ctrl-C: local up exited with {status}: {log.read_text()[-2000:]}"


def test_the_readme_is_short_and_opens_with_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= README_LINES_MAX, f"README.md has {len(text.splitlines())} lines"
    first = _SH_BLOCK.search(text)
    assert first is not None and first.group("body").splitlines() == README_COMMANDS, first


def test_the_readme_links_name_files_that_exist():
    links = [m.group("path") for m in _RELATIVE_LINK.finditer(README.read_text())]
    missing = [link for link in links if not (ROOT / link).exists()]
    assert links and not missing, f"README.md links to missing files: {missing}"
