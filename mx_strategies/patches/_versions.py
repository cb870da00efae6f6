"""The installed versions the patches are guarded by (read by :mod:`mx_strategies.releases`)."""

from __future__ import annotations

from ..releases import installed_release as installed


def modelexpress_in(low: tuple[int, int], high: tuple[int, int]) -> bool:
    """Whether the installed ModelExpress is in [low, high) by (major, minor)."""
    version = installed("modelexpress")
    return version is not None and low <= version[:2] < high
