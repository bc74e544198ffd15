"""The clock-jump fault's hook (mqmeta/clock.py): a process started with
MQMETA_CLOCK_OFFSET_FILE reads its wall clock as real time plus the file's offset, re-read
as it changes, while its monotonic clock (durations, leases) does not move."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

PROGRAM = """
import sys, time
import mqmeta.clock as clock
real = time.clock_gettime(time.CLOCK_REALTIME)
mono = time.monotonic()
print(round(clock.wall_ms() / 1000 - real), round(time.time() - real), flush=True)
sys.stdin.readline()  # the test rewrites the file
time.sleep(0.2)  # longer than the hook's re-read interval (the property: a new offset is seen)
real = time.clock_gettime(time.CLOCK_REALTIME)
print(round(time.time() - real), round(time.monotonic() - mono), flush=True)
"""


def test_the_offset_file_steps_the_wall_clock_and_not_the_monotonic_one(tmp_path):
    offset = tmp_path / "c1.offset_ms"
    offset.write_text("30000\n")
    env = dict(os.environ, MQMETA_CLOCK_OFFSET_FILE=str(offset))
    with subprocess.Popen(
        [sys.executable, "-c", PROGRAM], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().split() == ["30", "30"], "wall_ms and time.time both step"
        offset.write_text("-30000\n")
        child.stdin.write("\n")
        child.stdin.flush()
        stepped, monotonic = child.stdout.readline().split()
        assert stepped == "-30" and monotonic == "0", "a step back is seen; the monotonic clock never moved"
        assert child.wait(timeout=30) == 0
