"""`python -m bench.peers [--quick]` or `python bench/peers [--quick]` (bench/peers/run.py)."""

import sys
from pathlib import Path

if __package__ in (None, ""):  # `python bench/peers`: the repository root is not on the path yet
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from bench.peers.run import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
