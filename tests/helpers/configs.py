"""The ``config.json`` of a tiny model, as the tests' builders write it.

``tests/mtp_arch/builders.py`` (vLLM's MTP architectures) and
``tests/sglang_support/builders.py`` (SGLang's targets) each bind
:func:`write_config` to their own table of configs, as ``write_config(folder, name)``.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any, Callable, Mapping, Optional

REMOTE_MODULE = "configuration_tiny"  # the configuration module a remote-code config names in its auto_map


def write_config(
    folder: str,
    name: str,
    *,
    configs: Mapping[str, Mapping[str, Any]],
    indent: Optional[int] = None,
    remote_code: Optional[Callable[[Any], str]] = None,
) -> dict:
    """``config.json`` of target ``name`` (``configs[name]``, read now) in ``folder`` (created); returns it.

    ``indent``: ``json.dump``'s. A config with a ``_remote`` entry is of a
    type transformers does not know: the entry is left out of the file,
    ``auto_map`` names ``configuration_tiny.TinyConfig``, and the text
    ``remote_code(entry)`` is written beside it as ``configuration_tiny.py``.
    """
    config = copy.deepcopy(dict(configs[name]))
    remote = config.pop("_remote", None)
    os.makedirs(folder, exist_ok=True)
    if remote:
        if remote_code is None:
            raise ValueError(f"config {name!r} needs remote code ({remote!r}) and no remote_code was given")
        config["auto_map"] = {"AutoConfig": f"{REMOTE_MODULE}.TinyConfig"}
        with open(os.path.join(folder, f"{REMOTE_MODULE}.py"), "w") as handle:
            handle.write(remote_code(remote))
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(config, handle, indent=indent)
    return config
