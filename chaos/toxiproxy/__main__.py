"""`python -m mqmeta.chaos.toxiproxy --listen HOST:PORT [--config FILE]`."""

import sys

from mqmeta.chaos.toxiproxy.server import main

sys.exit(main())
