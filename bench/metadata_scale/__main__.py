"""`python -m bench.metadata_scale`: see the package's docstring."""

import sys

from bench.metadata_scale.orchestration import main

sys.exit(main(sys.argv[1:]))
