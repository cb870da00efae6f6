"""The ``mx-strategies`` command: one subcommand per module.

Each subcommand lives in its own module exposing ``NAME``, ``HELP``,
``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args) -> int``; adding
one is an import and an entry in :data:`COMMANDS`. Modules keep heavy
imports (torch, boto3, the streamer) inside ``run`` so ``--help`` stays
instant.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from types import ModuleType
from typing import Optional, Sequence

from .. import __version__
from . import demo, doctor, plugin

COMMANDS: tuple[ModuleType, ...] = (doctor, demo, plugin)

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mx-strategies",
        description="ModelExpress load strategies that lose no weight: check checkpoints, see the strategy work.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        description = getattr(command, "DESCRIPTION", command.HELP)
        sub = subparsers.add_parser(command.NAME, help=command.HELP, description=description)
        command.add_arguments(sub)
        sub.set_defaults(handler=command.run)
    return parser


def _doctor_json(argv: Sequence[str]) -> bool:
    """``doctor ... --json``: a usage error still prints doctor's JSON error object on stdout."""
    words = [a for a in argv if not a.startswith("-")]
    return bool(words) and words[0] == doctor.NAME and "--json" in argv


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    wants_json = _doctor_json(argv)
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said) if wants_json else contextlib.nullcontext():
            args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help/--version exit 0, usage errors 2
        code = exc.code if isinstance(exc.code, int) else EXIT_USAGE
        if wants_json:
            sys.stderr.write(said.getvalue())
            if code != 0:
                lines = [line for line in said.getvalue().splitlines() if line.strip()]
                reason = lines[-1].split(": error: ", 1)[-1] if lines else "invalid arguments"
                print(json.dumps(doctor.error_object(reason, code), indent=2))
        return code
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_usage(sys.stderr)
        names = ", ".join(command.NAME for command in COMMANDS)
        print(f"mx-strategies: error: choose a command ({names})", file=sys.stderr)
        return EXIT_USAGE
    try:
        return handler(args)
    except BrokenPipeError:  # `mx-strategies doctor ... | head` closed our stdout
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
