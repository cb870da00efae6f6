"""Safetensors headers, read straight from the file (the one reader the tests use).

A safetensors file starts with an 8-byte little-endian header length and a
JSON header; each tensor's ``data_offsets`` are relative to the end of it.
"""

from __future__ import annotations

import json
import os


def read_header(path: str) -> tuple[int, dict]:
    """(JSON length, header without ``__metadata__``) of the shard at ``path``."""
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return length, header


def header_order(path: str) -> list[str]:
    """A shard's tensor names in file (data offset) order."""
    _, header = read_header(path)
    return [name for name, _ in sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))]


def tensor_offsets(path: str, key: str | None = None) -> dict[str, tuple[str, int, int]]:
    """tensor -> (``key``, absolute start, end) in the file, in file order; ``key`` defaults to the file name."""
    length, header = read_header(path)
    key = os.path.basename(path) if key is None else key
    ordered = sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))
    return {n: (key, 8 + length + e["data_offsets"][0], 8 + length + e["data_offsets"][1]) for n, e in ordered}


def header_bytes(path: str) -> int:
    """What a headers-only reader fetches from this file: 8 + header length, at most the file."""
    with open(path, "rb") as handle:
        prefix = handle.read(8)
    length = int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
    return min(8 + length, os.path.getsize(path))


def metadata_bytes(folder: str) -> int:
    """Each shard's header bytes plus every ``*.json`` (index, config) of ``folder``."""
    total = 0
    for name in os.listdir(folder):
        full = os.path.join(folder, name)
        if name.endswith(".safetensors"):
            total += header_bytes(full)
        elif name.endswith(".json"):
            total += os.path.getsize(full)
    return total
