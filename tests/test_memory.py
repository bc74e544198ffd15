"""mqmeta/memory.py: a server hands its freed heap memory back to the kernel.

Property checked: after 80 MB of malloc'd blocks are freed around a few that stay (so the
free pages lie inside the heap, where glibc keeps them resident), return_freed_memory()
gives most of them back: the resident set falls by at least half of what was freed. Run
in a process of its own, so that the test process's heap does not blur the figures. It
fails with return_freed_memory a no-op (seen).
"""

from __future__ import annotations

import sys

import pytest

from tests.support.checks_process import run_script

pytestmark = pytest.mark.timeout(60)

SCRIPT = """
from mqmeta.memory import return_freed_memory

def rss_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])

blocks = [bytes(2048) for _ in range(40_000)]  # 80 MB through malloc (over pymalloc's 512 bytes)
kept = blocks[::50]  # these stay: the freed pages lie between them, not at the heap's top
grown = rss_kb()
del blocks
freed = rss_kb()
returned = return_freed_memory()
print(grown, freed, rss_kb(), returned, len(kept))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim, /proc")
def test_freed_heap_memory_is_handed_back():
    run = run_script(SCRIPT)
    assert run.returncode == 0, run.stderr
    grown, freed, after, returned, _ = run.stdout.split()
    assert int(freed) > int(grown) * 0.8, "glibc gave the pages back by itself: nothing to show"
    assert returned == "True" and int(freed) - int(after) > 40_000, run.stdout
