"""ModelExpress 0.8's plugin entry for ``robust_model_streamer``.

ModelExpress 0.8 imports every ``mx_plugin_<name>.py`` in ``MX_PLUGIN_DIR``
(default ``/opt/modelexpress/plugins``) and, with ``MX_LOAD_PLUGIN=<name>``,
puts the class its ``register_plugin()`` returns into the load chain before
``MX_LOAD_PLUGIN_BEFORE`` (default ``server-cache``). The file in this package
is that plugin: mount it into the folder, or let ``mx-strategies plugin
--write DIR`` copy it there (:func:`write_plugin`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

PLUGIN_NAME = "robust_model_streamer"
PLUGIN_FILE = Path(__file__).with_name(f"mx_plugin_{PLUGIN_NAME}.py")
DEFAULT_PLUGIN_DIR = "/opt/modelexpress/plugins"


def plugin_dir() -> Path:
    """The folder ModelExpress 0.8 reads plugins from (``MX_PLUGIN_DIR``, as 0.8 reads it)."""
    return Path(os.environ.get("MX_PLUGIN_DIR") or DEFAULT_PLUGIN_DIR)


def write_plugin(folder: "Path | str | None" = None) -> Path:
    """Copy the plugin file into ``folder`` (default: :func:`plugin_dir`); returns the file written."""
    target_dir = Path(folder) if folder is not None else plugin_dir()
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / PLUGIN_FILE.name
    shutil.copyfile(PLUGIN_FILE, target)
    return target
