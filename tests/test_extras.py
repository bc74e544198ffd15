"""What the core install runs, and what a missing extra answers, in fresh interpreters.

Each test blocks the packages of the extras (sys.modules[name] = None, as if they were
not installed) before `mqmeta.cli` is imported. Properties checked:
- with every extra missing, `mqmeta --help`, every command's --help and `--version` work
  (no command imports PySpark, aiohttp, the Toxiproxy or RocketMQ clients, or s3fs to
  build its parser), and --version is mqmeta.__version__;
- a command whose extra is missing exits 2 with one sentence naming the package and the
  extra (`pip install 'mqmeta[audit]'`), no traceback: the audit (audit), the chaos
  suite and its fault proxy (chaos), an s3:// tiered store and an s3a:// audit input (s3);
- mqmeta/extras.py lists, per extra, the packages pyproject.toml's extra installs.
(The real absence, in a venv with the wheel and no extras, is .ci/wheel_smoke.sh's.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import mqmeta
from mqmeta.extras import EXTRA_MODULES

pytestmark = [pytest.mark.timeout(120)]  # a few interpreter start-ups each, on a loaded machine
ROOT = Path(__file__).resolve().parent.parent
EVERY_EXTRA = sorted({module for modules in EXTRA_MODULES.values() for module, _ in modules} | {"s3fs"})
COMMANDS = ["controller", "namesrv", "local up", "broker", "produce", "consume", "admin", "chaos",
            "chaos run", "chaos toxiproxy", "chaos faultfs", "audit", "replicator"]  # fmt: skip


def run_without(blocked: list[str], *argv: str) -> subprocess.CompletedProcess:
    """`mqmeta ARGV` in a fresh interpreter where the `blocked` packages cannot be imported."""
    code = (
        "import sys\n"
        f"for name in {blocked!r}:\n"
        "    sys.modules[name] = None\n"
        "from mqmeta.cli import main\n"
        f"sys.exit(main({list(argv)!r}))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)


def assert_names_the_extra(result: subprocess.CompletedProcess, package: str, extra: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert f"needs {package}: pip install 'mqmeta[{extra}]'" in lines[0], result.stderr


def test_help_and_version_need_no_extra():
    # one interpreter for every --help: each command's parser is built anew
    code = (
        "import contextlib, io, json, sys\n"
        f"for name in {EVERY_EXTRA!r}:\n"
        "    sys.modules[name] = None\n"
        "from mqmeta.cli import main\n"
        "answers = {}\n"
        f"for command in {['', *COMMANDS]!r}:\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        try:\n"
        "            main([*command.split(), '--help'])\n"
        "        except SystemExit as exit:\n"
        "            answers[command] = [exit.code, out.getvalue()]\n"
        "print(json.dumps(answers))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert result.returncode == 0, result.stderr
    for command, (status, text) in json.loads(result.stdout).items():
        assert status == 0 and text.startswith(f"usage: mqmeta {command}".rstrip()), (command, text)
    version = run_without(EVERY_EXTRA, "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"mqmeta {mqmeta.__version__}"


def test_the_audit_without_its_extra(tmp_path):
    result = run_without(["pyspark"], "audit", str(tmp_path), "--report", str(tmp_path / "r"))
    assert_names_the_extra(result, "PySpark", "audit")
    result = run_without(["pyarrow"], "audit", str(tmp_path), "--report", str(tmp_path / "r"))
    assert_names_the_extra(result, "PyArrow", "audit")


def test_the_chaos_suite_without_its_extra(tmp_path):
    result = run_without(["toxiproxy"], "chaos", "run", "--fault", "all-kill", "--output-dir", str(tmp_path))
    assert_names_the_extra(result, "toxiproxy-python", "chaos")
    result = run_without(["aiohttp"], "chaos", "toxiproxy", "--listen", "127.0.0.1:0")
    assert_names_the_extra(result, "aiohttp", "chaos")
    result = run_without(
        ["pyspark"], "chaos", "matrix", "--faults", "all-kill", "--output-dir", str(tmp_path)
    )
    assert_names_the_extra(result, "PySpark", "chaos")


def test_object_store_urls_without_the_s3_extra(tmp_path):
    audit = run_without(["s3fs"], "audit", "s3a://bucket/run", "--report", str(tmp_path / "r"))
    assert_names_the_extra(audit, "s3fs", "s3")
    broker = run_without(
        ["s3fs"], "broker", "--broker-name", "b", "--listen", "127.0.0.1:1", "--controllers", "127.0.0.1:1",
        "--data-dir", str(tmp_path / "b"), "--tiered-store", "s3://bucket/tiered",
    )  # fmt: skip
    assert_names_the_extra(broker, "s3fs", "s3")


def _distribution(requirement: str) -> str:
    return requirement.split("==")[0].split("[")[0].lower()


def test_extras_list_what_pyproject_installs():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRA_MODULES) | {"dev"} == set(extras)
    for extra, modules in EXTRA_MODULES.items():
        pinned = {_distribution(r) for r in extras[extra] if not r.startswith("mqmeta")}
        included = {name for r in extras[extra] if r.startswith("mqmeta[") for name in r[7:-1].split(",")}
        names = {package.lower() for _, package in modules}
        expected = pinned | {p.lower() for e in included for _, p in EXTRA_MODULES[e]}
        assert names <= expected | {"numpy"}, (extra, names - expected)
        assert pinned - {"numpy"} <= names, (extra, pinned - names)
    assert "mqmeta[audit,chaos,peers,s3]" in extras["dev"], "dev is a superset of every extra"
