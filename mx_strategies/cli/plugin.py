"""``mx-strategies plugin``: put robust into ModelExpress 0.8's chain through 0.8's own plugin entry.

ModelExpress 0.8 loads strategy plugins from ``MX_PLUGIN_DIR``; the file it
needs ships in the wheel (:mod:`mx_strategies.modelexpress_plugin`). This
command prints where that file is and the variables a pod sets, or, with
``--write``, copies it into the plugin folder (an init container's job, or
an image build step). It only copies a file; whether the installed
ModelExpress reads plugins is asked of :mod:`mx_strategies.releases`
(``chain_takes_plugins``). ModelExpress 0.7 has no plugin folder: there
``--write`` alone refuses (one line on stderr: activate with ``MX_STRATEGY``),
and ``--write DIR`` writes only into the folder named, saying 0.7 will not read it.

Exit status: 0 done, 2 refused or the folder cannot be written (the reason on stderr).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from ..activation import STRATEGY_ENV
from ..modelexpress_plugin import DEFAULT_PLUGIN_DIR, PLUGIN_FILE, PLUGIN_NAME, plugin_dir, write_plugin

NAME = "plugin"
HELP = "write the ModelExpress 0.8 plugin file that puts robust into the load chain"
DESCRIPTION = (
    "Print, or with --write copy into MX_PLUGIN_DIR, the plugin file through which ModelExpress 0.8 puts "
    f"{PLUGIN_NAME} into its load chain (MX_LOAD_PLUGIN={PLUGIN_NAME}, MX_LOAD_PLUGIN_BEFORE=model_streamer). "
    "On ModelExpress 0.7, which has no plugins, MX_STRATEGY=mx_strategies.robust is the entry."
)
EXIT_ACCESS = 2

# What a pod sets beside the file: robust where model_streamer stood, after RDMA, server cache and InstantTensor.
ENVIRONMENT = {"MX_LOAD_PLUGIN": PLUGIN_NAME, "MX_LOAD_PLUGIN_BEFORE": "model_streamer"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--write", nargs="?", const="", metavar="DIR", default=None,
        help=f"copy the plugin file into DIR (default: $MX_PLUGIN_DIR, else {DEFAULT_PLUGIN_DIR})",
    )  # fmt: skip


# How robust enters a ModelExpress without plugins (0.7).
ACTIVATE_WITHOUT_PLUGINS = f"{STRATEGY_ENV}=mx_strategies.robust"


def release_without_plugins() -> Optional[str]:
    """``"ModelExpress 0.7.0"`` when the installed ModelExpress reads no plugin folder; None when it does.

    Asked of :func:`mx_strategies.releases.chain_takes_plugins`. Without ModelExpress installed here
    (an image that adds it later) nothing can be told, and None is returned.
    """
    from ..releases import chain_takes_plugins, installed_release

    try:
        if chain_takes_plugins():
            return None
    except ImportError:
        return None
    release = installed_release("modelexpress")
    return "ModelExpress " + (".".join(map(str, release)) if release else "(version unknown)")


def run(args: argparse.Namespace) -> int:
    without = release_without_plugins()
    if args.write is None:
        print(f"plugin file: {PLUGIN_FILE}")
        print(f"plugin folder: {plugin_dir()} (MX_PLUGIN_DIR)")
        for key, value in ENVIRONMENT.items():
            print(f"{key}={value}")
        if without:
            print(f"note: {without} (installed here) reads no plugin folder; on it set {ACTIVATE_WITHOUT_PLUGINS}")
        return 0
    if without and not args.write:
        print(
            f"mx-strategies plugin: {without} (installed here) has no plugin folder, nothing written; "
            f"activate robust with {ACTIVATE_WITHOUT_PLUGINS}, or pass --write DIR to write the file for a 0.8 image",
            file=sys.stderr,
        )
        return EXIT_ACCESS
    try:
        written = write_plugin(args.write or None)
    except OSError as exc:
        folder = args.write or plugin_dir()
        print(f"mx-strategies plugin: cannot write the plugin file into {folder}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_ACCESS
    print(f"wrote {written}")
    for key, value in ENVIRONMENT.items():
        print(f"{key}={value}")
    if without:
        print(
            f"note: {without} (installed here) will not read {written}: it has no plugin folder; "
            f"on it set {ACTIVATE_WITHOUT_PLUGINS}",
            file=sys.stderr,
        )
    return 0
