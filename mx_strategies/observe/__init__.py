"""Observe the load: its report, progress while it streams, and telemetry."""
