"""The target-load conformance sweep: architectures (archs.py) and the per-architecture child (child.py)."""
