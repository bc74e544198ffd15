"""Type-checks the tree as it is installed: one package, `mqmeta`, with the parts inside.

The repository keeps each part in a top-level folder (controller/, broker_agent/, ...)
and the wheel installs it as `mqmeta.<part>` (pyproject's package-dir). mypy resolves
modules by folder and knows no such mapping, so this lays the installed shape out as
symlinks under build/typecheck/ and runs mypy on it (and on tools/). Run from a checkout
with the dev extra installed: `python tools/typecheck.py`; CI does.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("controller", "broker_agent", "replicator", "cluster", "spark", "chaos")
TREE = ROOT / "build" / "typecheck"


def lay_out() -> Path:
    """build/typecheck/mqmeta: the base package's entries and each part, as symlinks."""
    shutil.rmtree(TREE, ignore_errors=True)
    package = TREE / "mqmeta"
    package.mkdir(parents=True)
    for entry in (ROOT / "mqmeta").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for part in PARTS:
        (package / part).symlink_to(ROOT / part)
    return TREE


def main() -> int:
    tree = lay_out()
    config = ["--config-file", str(ROOT / "pyproject.toml")]
    checked = subprocess.run([sys.executable, "-m", "mypy", *config, "-p", "mqmeta"], cwd=tree)
    tools = subprocess.run([sys.executable, "-m", "mypy", *config, "tools"], cwd=ROOT)
    return checked.returncode or tools.returncode


if __name__ == "__main__":
    sys.exit(main())
