"""Test and demo tooling: a loopback S3 server, a stand-in engine, synthetic checkpoints.

Nothing in the runtime imports this package; production loads never need
it. The loopback server needs the ``[demo]`` extra (moto's server);
:func:`require_demo_extra` says so in one line when it is missing.
"""

from __future__ import annotations

import importlib.util

DEMO_EXTRA_MODULES = ("moto", "flask", "werkzeug")  # moto's threaded server runs on flask/werkzeug
INSTALL_HINT = "pip install '.[demo]' in a clone of mx-strategies (or its wheel with [demo])"


class MissingDemoExtra(RuntimeError):
    """The ``[demo]`` extra is not installed; the message says what to install."""


def require_demo_extra(what: str = "this") -> None:
    """Raise MissingDemoExtra unless the loopback S3 server can run."""
    missing = [name for name in DEMO_EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingDemoExtra(f"{what} needs the demo extra ({', '.join(missing)} missing): {INSTALL_HINT}")


__all__ = ["INSTALL_HINT", "MissingDemoExtra", "require_demo_extra"]
