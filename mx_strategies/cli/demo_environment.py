"""The demos' surroundings: the user's MX_* settings set aside, the S3 server's request log quietened.

Both demos (:mod:`.demo`, :mod:`.demo_engine`) run inside these, so the user's
environment is left as found.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Iterator

DEMO_CLEARED_ENV_PREFIXES = ("MX_ROBUST_", "MX_STRATEGIES_CONFIG", "MX_MS_DISTRIBUTED")
# Kept from the user's environment: it only says where the module's answers are kept (or, empty, that they
# are not), which changes no figure the demo shows.
DEMO_KEPT_ENV = ("MX_ROBUST_READS_CACHE_DIR",)


@contextmanager
def demo_environment() -> Iterator[None]:
    """Run without the user's MX_* strategy settings; leave the environment as found.

    ``MX_ROBUST_READS_CACHE_DIR`` (:data:`DEMO_KEPT_ENV`) is kept: the demo writes the module's answers
    there, as a real load does, and a user who moved that folder expects the demo to follow.

    The demo sets MX_STRATEGY and MX_MODEL_URI, LoopbackS3 the AWS_* variables,
    and runai-model-streamer some of its own; all of it is undone.
    """
    saved = dict(os.environ)
    for key in saved:
        if key in DEMO_KEPT_ENV:
            continue
        if key.startswith(DEMO_CLEARED_ENV_PREFIXES + ("MX_STRATEGY", "MX_MODEL_URI")):
            del os.environ[key]
    try:
        yield
    finally:
        for key in [k for k in os.environ if k not in saved]:
            del os.environ[key]
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


@contextmanager
def quiet_s3_server_logs() -> Iterator[None]:
    """moto's werkzeug logs every request at INFO; the demo reports totals instead."""
    logger = logging.getLogger("werkzeug")
    saved = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(saved)


__all__ = ["DEMO_CLEARED_ENV_PREFIXES", "DEMO_KEPT_ENV", "demo_environment", "quiet_s3_server_logs"]
