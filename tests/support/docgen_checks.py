"""The reference pages in docs/reference/ are what `python tools/docgen.py` makes from the code
now, and what the code declares reaches them (a method's comment in proto/ too).

Properties: each committed page equals the generated one (else: "run python tools/docgen.py"),
and `--check` exits 1 naming a stale page; the output does not depend on the environment
(MQMETA_* variables, terminal width), yet a default taken from a variable is named; a flag, a
--config key, a metric, an error class or a method's access class planted in (or taken out
of) the code shows up in the page that documents it; a key or access class with no
description stops the generator; every metric name the metrics modules spell out is on the
metrics page.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from mqmeta.config_file import accept_config_file
from mqmeta.validate import FlagNumber

pytestmark = [pytest.mark.timeout(120)]

_SPEC = importlib.util.spec_from_file_location(
    "docgen", Path(__file__).parent.parent.parent / "tools" / "docgen.py"
)
assert _SPEC is not None and _SPEC.loader is not None
docgen = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(docgen)

METRICS_MODULES = ("controller/metrics.py", "broker_agent/metrics.py", "replicator/metrics.py")


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return docgen.generate()


def test_committed_pages_are_current(pages):
    assert sorted(pages) == ["cli.md", "config.md", "errors.md", "grpc.md", "metrics.md"]
    for name, wanted in pages.items():
        path = docgen.OUT_DIR / name
        assert path.is_file(), f"docs/reference/{name} is missing: run python tools/docgen.py"
        committed = path.read_text(encoding="utf-8")
        assert committed == wanted, f"docs/reference/{name} is stale: run python tools/docgen.py"


def test_check_names_a_stale_page_and_writing_fixes_it(tmp_path, capsys):
    assert docgen.main([], out_dir=tmp_path) == 0
    assert docgen.main(["--check"], out_dir=tmp_path) == 0
    (tmp_path / "grpc.md").write_text("# gRPC services\n", encoding="utf-8")
    (tmp_path / "cli.md").unlink()
    assert docgen.main(["--check"], out_dir=tmp_path) == 1
    err = capsys.readouterr().err
    assert "cli.md is stale" in err and "grpc.md is stale" in err and "metrics.md" not in err
    assert "run python tools/docgen.py" in err
    assert docgen.main([], out_dir=tmp_path) == 0
    assert docgen.main(["--check"], out_dir=tmp_path) == 0


def test_pages_do_not_depend_on_the_environment(pages, monkeypatch):
    monkeypatch.setenv("MQMETA_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("COLUMNS", "37")
    assert docgen.cli_page() == pages["cli.md"]
    assert docgen.config_page() == pages["config.md"]


def _throwaway_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqmeta")
    parser.add_argument("--version", action="version", version="0")
    sub = parser.add_subparsers(dest="command", required=True)
    planted = sub.add_parser("planted", help="a command planted by the test")
    planted.add_argument("--planted-count", type=FlagNumber("--planted-count", int, 2, 7), default=3)
    planted.add_argument("--planted-mode", choices=["fast", "safe"], default="safe", help="how to go")
    accept_config_file(planted)
    return parser


def test_a_planted_flag_shows_in_the_cli_and_config_pages():
    parser = _throwaway_parser()
    cli = docgen.cli_page(parser)
    assert "| `--version` | switch |   | show program's version number and exit |" in cli
    assert "## mqmeta planted\n" in cli and "\na command planted by the test\n" in cli
    assert "| `--planted-count` | a whole number from 2 to 7 | `3` |" in cli
    assert "| `--planted-mode` | one of `fast`, `safe` | `safe` | how to go |" in cli
    config = docgen.config_page(parser)
    assert "## mqmeta planted --config" in config
    assert "| `planted_count` | integer | a whole number from 2 to 7 | `3` | `--planted-count` |" in config


def test_a_default_from_the_environment_is_named(pages):
    import os

    assert "| `--log-level` | text | `WARNING` (`$MQMETA_LOG_LEVEL` if set) |" in pages["cli.md"]

    def build() -> argparse.ArgumentParser:
        parser = _throwaway_parser()
        planted = docgen.subcommands(parser)[0][1]
        planted.add_argument("--planted-peer", default=os.environ.get("MQMETA_PLANTED_PEER", "p1"))
        return parser

    environment = docgen.environment_defaults(build, ["MQMETA_PLANTED_PEER", "MQMETA_OTHER"])
    assert environment == {("mqmeta", "planted", "planted_peer"): "MQMETA_PLANTED_PEER"}
    page = docgen.cli_page(build(), environment)
    assert "| `--planted-peer` | text | `p1` (`$MQMETA_PLANTED_PEER` if set) |" in page


def test_a_numeric_flag_without_a_range_stops_the_generator():
    parser = _throwaway_parser()
    planted = docgen.subcommands(parser)[0][1]
    planted.add_argument("--unbounded", type=int, default=1)
    with pytest.raises(ValueError, match="no range"):
        docgen.cli_page(parser)


def test_a_method_missing_from_the_access_table_shows_as_fail_closed(pages):
    from mqmeta import auth

    method = "/mqmeta.v1.ControllerService/GetMetadata"
    assert auth.METHOD_ACCESS[method] is auth.Access.READ
    assert "not in the access table" not in pages["grpc.md"]  # every served method is listed
    assert "| `GetMetadata` | `mqmeta.v1.GetMetadataRequest` |" in pages["grpc.md"]
    assert (
        "| ADMIN | Graceful handoff (`mqmeta admin handoff`): the master" in pages["grpc.md"]
    )  # proto comment
    access = {name: access for name, access in auth.METHOD_ACCESS.items() if name != method}
    page = docgen.grpc_page(access)
    row = next(line for line in page.splitlines() if line.startswith("| `GetMetadata` |"))
    assert "| READ |" not in row and "| ADMIN (not in the access table: fail closed) |" in row


def test_a_planted_metric_and_error_class_show_up(pages):
    from mqmeta import errors

    registry = CollectorRegistry()
    Counter("mqmeta_planted_things", "things planted by the test", ["where"], registry=registry).labels("x")
    page = docgen.metrics_page({"planted": registry})
    assert "| `mqmeta_planted_things_total` | counter | `where` | things planted by the test |" in page
    planted = type("PlantedError", (errors.NotFound,), {"__module__": errors.__name__, "__doc__": "Planted."})
    try:
        row = "| `PlantedError` | `NotFound` | NOT_FOUND | `NOT_FOUND` | Planted. |"
        assert row in docgen.errors_page()
    finally:
        del planted
        gc.collect()
    assert "PlantedError" not in docgen.errors_page()


def test_every_metric_the_code_names_is_on_the_metrics_page(pages):
    """The stand-ins must reach every branch that yields a family (e.g. a master's tiered gauges)."""
    root = docgen.ROOT
    named = set()
    for module in METRICS_MODULES:
        source = (root / module).read_text(encoding="utf-8")
        prefix = re.search(r'^PREFIX = "(\w+)"', source, flags=re.MULTILINE)
        named |= {name for name in re.findall(r'"(mqmeta_\w+)"', source) if not name.endswith("_")}
        if prefix:
            named |= {prefix.group(1) + name for name in re.findall(r'PREFIX \+ "(\w+)"', source)}
    assert len(named) >= 25, sorted(named)
    documented = set(re.findall(r"^\| `(mqmeta_\w+?)(?:_total|_bucket)?`", pages["metrics.md"], re.MULTILINE))
    assert named <= documented, f"not on the metrics page: {sorted(named - documented)}"


def test_a_new_setting_without_a_description_stops_the_generator(monkeypatch):
    from mqmeta.controller import state_machine

    monkeypatch.setitem(state_machine.CONFIG_SCHEMA, "planted_ms", (int, 5, 1, 9))
    with pytest.raises(
        ValueError, match=r"RUNTIME_MEANINGS in tools/docgen.py is out of date for \['planted_ms'\]"
    ):
        docgen.config_page()
    monkeypatch.setitem(docgen.RUNTIME_MEANINGS, "planted_ms", "a planted setting")
    assert (
        "| `planted_ms` | integer | a whole number from 1 to 9 | `5` | a planted setting |"
        in docgen.config_page()
    )
