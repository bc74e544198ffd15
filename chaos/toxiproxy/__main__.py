"""`python -m chaos.toxiproxy --listen HOST:PORT [--config FILE]`."""

import sys

from chaos.toxiproxy.server import main

sys.exit(main())
