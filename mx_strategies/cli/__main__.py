"""``python -m mx_strategies.cli``: the ``mx-strategies`` command, for environments without its script."""

import sys

from . import main

sys.exit(main())
