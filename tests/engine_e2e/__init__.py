"""Real-engine end-to-end helpers (tests/test_engine_e2e.py, docs/engine-e2e.md).

``models``: tiny DeepSeek-V3 / Qwen3-Next MTP checkpoints; ``harness``: one
engine run in a child process with a timeout; ``child``: that process;
``worker_ext``: methods mixed into vLLM's worker for ``collective_rpc``.
"""
