"""``python -m securefed.cli``: the ``securefed`` command without its console script."""

import sys

from .main import main

sys.exit(main())
