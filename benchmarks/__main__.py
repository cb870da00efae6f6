"""``python -m benchmarks``: see :mod:`benchmarks`."""

import sys

from .cli import main

sys.exit(main())
