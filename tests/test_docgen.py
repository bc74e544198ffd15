"""The generated reference pages (docs/reference/) match the code, and a planted change
shows up in them: the checks of tests/support/docgen_checks.py, run by pytest in a fresh
interpreter. The generator imports our apache.rocketmq.v2 stubs, which cannot share a
process with the official RocketMQ 5 client's (other test modules import it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
CHECKS = "tests/support/docgen_checks.py"


def test_the_reference_pages_are_current_and_follow_the_code():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", CHECKS, "-n", "0", "-q", "-p", "no:cacheprovider", "-m", ""],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout, done.stdout[-2000:]
