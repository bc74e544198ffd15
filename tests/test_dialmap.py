"""The dial map redirects connects only: a mapped address dials its proxy, others dial
themselves; a bad MQMETA_DIAL_MAP is one sentence and exit 2 at start, not a thread's traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mqmeta import dialmap
from mqmeta.errors import InvalidArgument


@pytest.fixture(autouse=True)
def _restore():
    yield
    dialmap.install({})


def test_install_redirects_only_mapped_addresses():
    dialmap.install({"127.0.0.1:1000": "127.0.0.1:2000"})
    assert dialmap.dial("127.0.0.1:1000") == "127.0.0.1:2000"
    assert dialmap.dial("127.0.0.1:1001") == "127.0.0.1:1001"
    with pytest.raises(InvalidArgument, match="HOST:PORT"):
        dialmap.install({"nowhere": "127.0.0.1:2000"})


def test_the_environment_file_is_read(tmp_path, monkeypatch):
    path = tmp_path / "map.json"
    path.write_text('{"127.0.0.1:7": "127.0.0.1:8"}')
    monkeypatch.setenv(dialmap.ENVIRONMENT_VARIABLE, str(path))
    dialmap.load_from_environment()
    assert dialmap.dial("127.0.0.1:7") == "127.0.0.1:8"


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not a readable JSON file"),
        ('["127.0.0.1:7"]', "must be a JSON object"),
    ],
)
def test_a_bad_map_is_exit_2_with_a_sentence(tmp_path, content, message):
    path = tmp_path / "map.json"
    path.write_text(content)
    done = subprocess.run(
        [sys.executable, "-m", "mqmeta.cli", "admin", "--controllers", "127.0.0.1:1", "cluster-status"],
        capture_output=True,
        text=True,
        env={"MQMETA_DIAL_MAP": str(path), "PATH": ""},
        timeout=60,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
