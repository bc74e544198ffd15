"""The distribution's shape: one import package, every folder in it, both artefacts.

Properties checked:
- pyproject.toml's package list names every package folder of the tree (each folder
  with an __init__.py under mqmeta/ and the six parts), mapped by package-dir, and no
  package that has no folder;
- the wheel `pip wheel --no-deps .` builds holds exactly one top-level package, mqmeta,
  beside its .dist-info; the parts' modules are in it as mqmeta.<part>;
- the sdist's manifest takes the protos and the license;
- the version has one home, mqmeta.__version__, which pyproject reads.
(That `import controller` fails where the wheel is installed is .ci/wheel_smoke.sh's.)
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("controller", "broker_agent", "replicator", "cluster", "spark", "chaos")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def folder_of(package: str) -> Path:
    """Where setuptools takes `package` from (package-dir maps the parts' folders)."""
    mapping = SETUPTOOLS.get("package-dir", {})
    parts = package.split(".")
    for length in range(len(parts), 0, -1):
        prefix = ".".join(parts[:length])
        if prefix in mapping:
            return ROOT / mapping[prefix] / Path(*parts[length:])
    return ROOT / Path(*parts)


def package_folders() -> set[str]:
    """Every package of the tree as its import name."""
    found = set()
    for top, name in [("mqmeta", "mqmeta"), *((part, f"mqmeta.{part}") for part in PARTS)]:
        for init in (ROOT / top).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / top)
            found.add(".".join([name, *relative.parts]))
    return found


def test_the_package_list_names_every_package_folder():
    listed = set(SETUPTOOLS["packages"])
    assert listed == package_folders(), {
        "folders not listed": package_folders() - listed,
        "listed without a folder": listed - package_folders(),
    }
    for package in listed:
        assert (folder_of(package) / "__init__.py").is_file(), package


@pytest.mark.timeout(180)
def test_the_wheel_holds_one_top_level_package(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("mqmeta-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert tops - dist_info == {"mqmeta"} and len(dist_info) == 1, sorted(tops)
    for part in PARTS:
        assert f"mqmeta/{part}/__init__.py" in names, part
    assert "mqmeta/cli.py" in names and "mqmeta/pb/controller_pb2.py" in names


def test_the_sdist_takes_the_protos_and_the_license():
    manifest = (ROOT / "MANIFEST.in").read_text().splitlines()
    assert "include LICENSE" in manifest
    assert "recursive-include proto *.proto" in manifest
    assert list((ROOT / "proto").rglob("*.proto")), "there are protos to take"


def test_the_version_has_one_home():
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert SETUPTOOLS["dynamic"]["version"] == {"attr": "mqmeta.__version__"}
