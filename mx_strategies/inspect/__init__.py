"""Inspect the source: storage and ranged reads, the checkpoint's headers and index, the source chain."""
