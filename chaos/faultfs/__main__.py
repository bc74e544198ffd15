"""`python -m mqmeta.chaos.faultfs BACKING MOUNTPOINT CONTROL`: one mount's process."""

import logging
import sys
from pathlib import Path

from mqmeta.chaos.faultfs.mount import serve

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if len(sys.argv) != 4:
        sys.exit("usage: python -m mqmeta.chaos.faultfs BACKING MOUNTPOINT CONTROL")
    serve(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
