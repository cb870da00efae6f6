"""The fault-injecting proxy lives in :mod:`helpers.faults`; this name stays for existing imports.

``python tests/faults.py`` still prints docs/faults.md's fault table.
"""

from helpers.faults import *  # noqa: F401,F403

if __name__ == "__main__":  # pragma: no cover - a measuring tool, run by hand
    from helpers.faults import _table

    _table()
