"""Builders for tests/test_mtp_architectures.py: tiny real-architecture configs and vLLM's own MTP draft modules."""
